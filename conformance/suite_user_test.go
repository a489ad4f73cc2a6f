package conformance_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// The user-data cases must be able to fail too: broken user resources, a
// broken negative control, a missing ability.

// userOverride is the in-memory harness with its user resource replaced.
type userOverride struct {
	*memHarness
	wrap func(*memUser) conformance.UserResource
}

func (h userOverride) UserDataResource(ctx context.Context, gap conformance.Gap) (conformance.UserResource, error) {
	u, err := h.memHarness.UserDataResource(ctx, gap)
	return h.wrap(u.(*memUser)), err
}

func withUser(wrap func(*memUser) conformance.UserResource) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return userOverride{h.(*memHarness), wrap}, nil
	}
}

// uncheckedUser writes both tables and sets the floor whatever the token.
type uncheckedUser struct{ *memUser }

func (u uncheckedUser) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.floors[w.Scope] = w.Token
	u.store(w, time.Now())
	return leasecore.Result{Accepted: true, Floor: w.Token}, nil
}

func (u uncheckedUser) Advance(ctx context.Context, cl leasecore.Claim) (leasecore.Result, error) {
	if err := backendkit.CheckClaim(ctx, "advance", cl); err != nil {
		return leasecore.Result{}, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.floors[cl.Scope] = cl.Token
	return leasecore.Result{Accepted: true, Floor: cl.Token}, nil
}

// tornUser fences the first table only: the second is written even when
// the fence rejects, as if it were written outside the transaction.
type tornUser struct{ *memUser }

func (u tornUser) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	r, err := u.memUser.Write(ctx, w)
	if err == nil && !r.Accepted {
		u.mu.Lock()
		u.tables[1][[2]string{w.Scope, w.Part}] = leasecore.StoredPart{Scope: w.Scope, Part: w.Part,
			Content: w.Content, Writer: w.Writer, Token: w.Token, WrittenAt: time.Now()}
		u.mu.Unlock()
	}
	return r, err
}

// lockingUser is the design before the fence decided at commit: it
// takes the floor's lock (memUserData.floorLock, a row lock: reads do not
// wait for it) and compares first, and holds the lock while the rest of
// its transaction runs (InTransaction, the commit gap), so a newer
// writer, or its Advance, waits for it.
type lockingUser struct{ *memUser }

func (u lockingUser) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	u.floorLock.Lock()
	defer u.floorLock.Unlock()
	u.mu.Lock()
	floor := u.floors[w.Scope]
	u.mu.Unlock()
	if w.Token < floor {
		return leasecore.Result{Floor: floor}, nil
	}
	if err := conformance.InTransaction(ctx, w, func(context.Context) error { return nil }); err != nil {
		return leasecore.Result{}, err
	}
	if u.gap != nil {
		if err := u.gap(ctx, w); err != nil {
			return leasecore.Result{}, err
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.floors[w.Scope] = w.Token
	u.store(w, time.Now())
	return leasecore.Result{Accepted: true, Floor: w.Token}, nil
}

func (u lockingUser) Advance(ctx context.Context, cl leasecore.Claim) (leasecore.Result, error) {
	u.floorLock.Lock()
	defer u.floorLock.Unlock()
	return u.memUser.Advance(ctx, cl)
}

// oneTable writes a single user table.
type oneTable struct{ *memUser }

func (u oneTable) Rows(ctx context.Context, scope, part string) ([]conformance.UserRow, error) {
	rows, err := u.memUser.Rows(ctx, scope, part)
	if len(rows) > 1 {
		rows = rows[:1]
	}
	return rows, err
}

func expectOutput(t *testing.T, nh conformance.NewHarness, ids []string, want ...string) conformance.Summary {
	t.Helper()
	sum, out := report(t, nh, ids...)
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	return sum
}

func TestSuiteFailsUncheckedUserData(t *testing.T) {
	sum := expectOutput(t, withUser(func(u *memUser) conformance.UserResource { return uncheckedUser{u} }),
		[]string{"F1u", "F7u", "F10u"},
		"FAIL [I3] holder-a's late write with token=1 is rejected (expected=accepted=false floor=2, actual=accepted=true floor=1)",
		"FAIL [I3] summary holds holder-b's content (expected=rows=101(B) by holder-b token=2, actual=rows=100(A) by holder-a token=1)",
		"FAIL [I3] the scope floor rejects A's detail",
		"FAIL [I3] holder-a's detail with token=1, a part nobody wrote since the advance, is rejected",
		"FAIL [I3] no row of holder-a's detail exists (expected=(none), actual=detail(A) by holder-a token=1)",
		"FAIL [I3] holder-a's advance with the stale token=1 is rejected")
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0 for a user resource that does not check tokens")
	}
}

// TestSuiteFailsAFenceHeldOpen: a fence that holds the floor while the
// transaction runs makes the other writer wait: F6u and F18 say so.
func TestSuiteFailsAFenceHeldOpen(t *testing.T) {
	t.Parallel()
	sum := expectOutput(t, withUser(func(u *memUser) conformance.UserResource { return lockingUser{u} }), []string{"F6u", "F18"},
		"FAIL [I3] A then B: B's token reaches the floor while A's transaction is open",
		"FAIL [I3] B then A: A's write returns while B's transaction is open",
		"FAIL [F18] B's Advance returns within 1s while A's transaction is open and busy")
	if sum.Failed == 0 {
		t.Error("Summary.Failed = 0")
	}
}

func TestSuiteFailsTornUserData(t *testing.T) {
	sum := expectOutput(t, withUser(func(u *memUser) conformance.UserResource { return tornUser{u} }),
		[]string{"F7u"},
		"FAIL [I3] detail was never written (expected=(none), actual=tables disagree: ReadPart: (none); job_run: (none); job_line: detail(A) by holder-a token=1)")
	if sum.Failed != 1 {
		t.Errorf("Summary.Failed = %d, want 1 (the torn detail)", sum.Failed)
	}
}

func TestSuiteFailsOneUserTable(t *testing.T) {
	expectOutput(t, withUser(func(u *memUser) conformance.UserResource { return oneTable{u} }),
		[]string{"F1u"},
		"FAIL the user resource read back 1 user table(s) for daily-report/summary; it must write at least two in one atomic operation")
}

// The negative control must be able to fail: a marker-first control that
// checks the token after all shows no flaw, and F4m says so.
func TestSuiteFailsMarkerFirstThatChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("a paused-holder timeline takes about 7 s")
	}
	t.Parallel()
	sum := expectOutput(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		h.(*memHarness).markerChecksToken = true
		return h, nil
	}, []string{"F4m"},
		"ok   [I3] A's marker goes through the fenced part store and is accepted",
		"FAIL negative control did not expose: marker first, rows second")
	if sum.Failed != 1 {
		t.Errorf("Summary.Failed = %d, want 1 (the exposure)", sum.Failed)
	}
}

// userDataAbsent declares the user data ability absent.
type userDataAbsent struct{ *memHarness }

func (h userDataAbsent) Traits() conformance.Traits {
	t := h.memHarness.Traits()
	t.Absent[conformance.AbilityUserData] = "no user tables here"
	return t
}

var userCases = []string{"F1u", "F4u", "F4m", "F6u", "F7u", "F10u"}

func TestSuiteUserDataAbility(t *testing.T) {
	t.Run("undeclared", func(t *testing.T) {
		sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
			h, _ := newMemHarness(ctx)
			return undeclared{h}, nil
		}, append(userCases, "X1")...)
		const want = "FAIL the harness neither implements *conformance.UserDataResources (user data) nor declares it absent"
		// Every user case, and X1's user-data section, fails.
		if n := strings.Count(out, want); n != 7 {
			t.Errorf("%d failures for the missing ability, want 7 (six cases and X1):\n%s", n, out)
		}
		if sum.Failed < 7 {
			t.Errorf("Summary.Failed = %d, want at least 7", sum.Failed)
		}
	})
	t.Run("declared absent", func(t *testing.T) {
		sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
			h, _ := newMemHarness(ctx)
			return userDataAbsent{h.(*memHarness)}, nil
		}, append(userCases, "X1")...)
		if n := strings.Count(out, "  skip user data: no user tables here"); n != 7 {
			t.Errorf("%d skips with the declared reason, want 7 (six cases and X1's section):\n%s", n, out)
		}
		if sum.Failed != 0 || sum.Skipped != len(userCases) {
			t.Errorf("failed=%d skipped=%d, want 0 and %d:\n%s", sum.Failed, sum.Skipped, len(userCases), out)
		}
	})
}

// TestHolderPrepare runs the holder protocol in this process: PREPARE
// answers "none" for a one-step resource and calls Prepare on a two-step
// one; the other commands are unchanged.
func TestHolderPrepare(t *testing.T) {
	h, _ := newMemHarness(context.Background())
	mh := h.(*memHarness)
	marker, _ := mh.MarkerFirstResource(context.Background())
	for _, tc := range []struct {
		name string
		res  leasecore.FencedResource
		want []string
	}{
		{"one step", memfence.NewResource(), []string{
			"ACQUIRED token=1", "READY_TO_WRITE token=1", "PREPARED none", "WRITE accepted=true token=1 floor=1", "RELEASED ok=true"}},
		{"marker first", marker, []string{
			"ACQUIRED token=1", "READY_TO_WRITE token=1", "PREPARED accepted=true token=1 floor=1", "WRITE accepted=true token=1 floor=0", "RELEASED ok=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := strings.NewReader("ACQUIRE job host-a 5s 1s 500ms\nCHECK\nPREPARE report summary marker\nWRITE report summary rows=1\nRELEASE\nEXIT\n")
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- conformance.RunHolder(context.Background(), memfence.NewLeases(nil), tc.res, in, pw)
				pw.Close()
			}()
			out, _ := io.ReadAll(pr)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var replies []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if !strings.HasPrefix(l, "EVENT ") {
					replies = append(replies, l)
				}
			}
			if strings.Join(replies, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("replies:\n%s\nwant:\n%s", strings.Join(replies, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
