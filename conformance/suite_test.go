package conformance_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// The suite must be able to fail: these tests run it against broken
// backends and check that it says so, case by case.

// unfencedAsFenced is a harness whose "fenced" resource is the naive
// unfenced one.
type unfencedAsFenced struct{ *memHarness }

func (h unfencedAsFenced) OpenResource(ctx context.Context) (conformance.Resource, error) {
	return h.UnfencedResource(ctx)
}

// reusedTokens is a lease service that hands out token 1 on every acquire.
type reusedTokens struct{ leasecore.Lease }

func (l reusedTokens) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	g.Token = 1
	return g, err
}

func (l reusedTokens) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	return l.Lease.(leasecore.LeaseInspector).Inspect(ctx, name)
}

type reusedTokenHarness struct{ *memHarness }

func (h reusedTokenHarness) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	l, err := h.memHarness.OpenLease(ctx)
	return reusedTokens{l}, err
}

// undeclared lacks the negative controls without declaring them absent.
type undeclared struct {
	conformance.Harness // hides memHarness's optional methods
}

func report(t *testing.T, nh conformance.NewHarness, ids ...string) (conformance.Summary, string) {
	t.Helper()
	var out bytes.Buffer
	sum, err := conformance.Report(context.Background(), &out, nh, conformance.ReportOptions{Cases: ids})
	if err != nil {
		t.Fatalf("Report: %v", err)
	}
	return sum, out.String()
}

func TestSuiteFailsUnfencedResource(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return unfencedAsFenced{h.(*memHarness)}, nil
	}, "F1", "F7", "F9")
	for _, want := range []string{
		"FAIL [I3] holder-a's late write with token=1 is rejected",
		"FAIL [I3] the scope floor rejects A's detail",
		"FAIL [I3] order B->A: the fenced resource keeps the newest content",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0 for an unfenced resource")
	}
}

func TestSuiteFailsReusedTokens(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return reusedTokenHarness{h.(*memHarness)}, nil
	}, "F1", "F3")
	for _, want := range []string{
		"FAIL [I2] holder-b acquires right after the release, with a larger token (expected=token=2, actual=token=1)",
		"FAIL [I2] round 3's winner holds the next token",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0 for a lease that reuses tokens")
	}
}

func TestSuiteFailsUndeclaredAbility(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return undeclared{h}, nil
	}, "F7")
	if !strings.Contains(out, "FAIL the harness neither implements *conformance.NegativeControls (negative controls) nor declares it absent") {
		t.Errorf("an undeclared missing ability did not fail:\n%s", out)
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0")
	}
}

func TestReportFormat(t *testing.T) {
	t.Parallel()
	sum, out := report(t, newMemHarness)
	if sum.Failed != 0 {
		t.Fatalf("failed=%d:\n%s", sum.Failed, out)
	}
	for _, id := range []string{"F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "F9b", "F1u", "F4u", "F4m", "F6u", "F7u", "F10u", "F11", "F12", "F13", "F14", "F15", "F16", "F17", "F18", "X1", "X2"} {
		if !regexp.MustCompile(`(?m)^CASE ` + id + ` :: \S`).MatchString(out) {
			t.Errorf("no CASE %s header:\n%s", id, out)
		}
	}
	// Every line is a header, a check, a note, a skip, a section or the summary.
	line := regexp.MustCompile(`^(CASE [FX]\d+[umb]? :: .+|  (ok  |FAIL|note|skip) .+|  -- .+|SUMMARY passed=\d+ failed=\d+)$`)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("line not in the report's line format: %q", l)
		}
	}
	if last := lines[len(lines)-1]; last != "SUMMARY passed="+strconv.Itoa(sum.Passed)+" failed=0" {
		t.Errorf("last line %q", last)
	}
	if !strings.Contains(out, "  skip long transaction: an in-memory map has no transactions and one clock") {
		t.Errorf("a declared absence did not print its reason:\n%s", out)
	}
	if _, err := conformance.Report(context.Background(), &bytes.Buffer{}, newMemHarness,
		conformance.ReportOptions{Cases: []string{"F42"}}); err == nil {
		t.Errorf("an unknown case ID was accepted")
	}
	// CaseIDs lists the cases Report ran, in its order.
	var ran []string
	for _, c := range sum.Cases {
		ran = append(ran, c.ID)
	}
	if ids := conformance.CaseIDs(); !slices.Equal(ids, ran) {
		t.Errorf("CaseIDs() = %v, Report ran %v", ids, ran)
	}
}

// atomicOnly declares the commit gap absent, as etcd does.
type atomicOnly struct{ *memHarness }

func (h atomicOnly) Traits() conformance.Traits {
	t := h.memHarness.Traits()
	t.Absent[conformance.AbilityCommitGap] = "one atomic request, nothing to pause"
	t.Absent[conformance.AbilityLockWaitProbe] = "no lock to wait on"
	return t
}

func TestF6RunsTheAtomicAnalogueWithoutACommitGap(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return atomicOnly{h.(*memHarness)}, nil
	}, "F6")
	for _, want := range []string{
		"  note commit gap absent (one atomic request, nothing to pause): the atomic analogue runs instead",
		"  ok   [I3] the race: B (token 2) is accepted whichever request arrives first (expected=8 of 8 rounds, actual=8 of 8 rounds)",
		"  ok   [I3] the race: the final data is token 2's and the floor is 2 (expected=8 of 8 rounds, actual=8 of 8 rounds)",
		"  note the race: A (token 1) arrived first and was accepted in ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "  skip ") {
		t.Errorf("F6(b) prints a skip although its analogue runs and counts:\n%s", out)
	}
	if sum.Failed != 0 || sum.Passed != 3 {
		t.Errorf("passed=%d failed=%d, want 3 passed (F6a's control, the race's two checks):\n%s", sum.Passed, sum.Failed, out)
	}
}

// newestRejected is a fenced resource that turns down every write with
// token 2: the newer writer loses whichever way the race goes.
type newestRejected struct{ conformance.Resource }

func (r newestRejected) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if w.Token == 2 {
		f, err := r.Floor(ctx, w.Scope)
		return leasecore.Result{Accepted: false, Floor: f}, err
	}
	return r.Resource.Write(ctx, w)
}

type atomicNewestRejected struct{ atomicOnly }

func (h atomicNewestRejected) OpenResource(ctx context.Context) (conformance.Resource, error) {
	r, err := h.atomicOnly.OpenResource(ctx)
	return newestRejected{r}, err
}

// The atomic analogue's race checks can fail: a resource that rejects the
// newer writer fails both, in every round.
func TestF6AtomicRaceFailsWhenTheNewerWriterLoses(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return atomicNewestRejected{atomicOnly{h.(*memHarness)}}, nil
	}, "F6")
	for _, want := range []string{
		"  FAIL [I3] the race: B (token 2) is accepted whichever request arrives first (expected=8 of 8 rounds, actual=0 of 8 rounds)",
		"  FAIL [I3] the race: the final data is token 2's and the floor is 2 (expected=8 of 8 rounds, actual=0 of 8 rounds)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed != 2 {
		t.Errorf("failed=%d, want 2:\n%s", sum.Failed, out)
	}
}

// droppedAcquire is a lease whose acquire by one contender fails as a
// dropped connection: neither a grant nor ErrHeld.
type droppedAcquire struct{ leasecore.Lease }

func (l droppedAcquire) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if holder == "holder-07" {
		return leasecore.Grant{}, fmt.Errorf("%w: connection reset (doctored)", leasecore.ErrUnavailable)
	}
	return l.Lease.Acquire(ctx, name, holder, ttl)
}

func (l droppedAcquire) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	return l.Lease.(leasecore.LeaseInspector).Inspect(ctx, name)
}

// F3's expectations come from the round's design and its attempt count
// from the clients' answers: a contender that gets neither a grant nor
// ErrHeld fails the round's refusal count and the attempt count.
func TestF3FailsAnAttemptNotAnswered(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		m := h.(*memHarness)
		return brokenInput{memHarness: m, lease: func(l *memfence.Leases) leasecore.Lease { return droppedAcquire{l} }}, nil
	}, "F3")
	for _, want := range []string{
		"  FAIL [I1] round 2, lease held: every contender is told the lease is held (expected=16 ErrHeld, actual=15 ErrHeld, other errors: ",
		"  FAIL [F3] attempts in all, each answered with a grant or ErrHeld (expected=48, actual=45)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed < 4 {
		t.Errorf("failed=%d, want at least 4 (three rounds, the attempt count):\n%s", sum.Failed, out)
	}
}

// A's renewal after its write must fail with ErrLost: a holder whose
// renewal fails as a dropped connection fails the line, in F4 and in its
// negative control F5, whose checks carry F5's own tag.
func TestF4FailsARenewalLostToAConnection(t *testing.T) {
	t.Parallel()
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		m := h.(*memHarness)
		m.dropRenewAfterWrite = true
		return m, nil
	}, "F4", "F5")
	want := "  FAIL [I1] A's renewal after its write fails with ErrLost: the lease moved on (expected=RENEW_AFTER_WRITE ok=false err=ErrLost, actual=RENEW_AFTER_WRITE ok=false err=ErrUnavailable)"
	if n := strings.Count(out, want); n != 2 {
		t.Errorf("%q printed %d times, want 2 (F4 and F5):\n%s", want, n, out)
	}
	_, f5, _ := strings.Cut(out, "CASE F5 ")
	if !strings.Contains(f5, "  ok   [F5] A passes its local-deadline check") || strings.Contains(f5, "[F4]") {
		t.Errorf("F5's checks are not tagged [F5]:\n%s", f5)
	}
	// B's holder is doctored too: its renewal after its write fails.
	if n := strings.Count(out, "  FAIL [I1] B renews (expected=RENEW ok=true, actual=RENEW ok=false)"); sum.Failed != 4 || n != 2 {
		t.Errorf("failed=%d, B's renewal failed %d times; want 4 and 2:\n%s", sum.Failed, n, out)
	}
}

// Backends that break the input rule, for X1.

// plainWriteErrors validates writes but refuses bad ones with a plain
// error: no sentinel, no field name.
type plainWriteErrors struct{ *memfence.Resource }

func (r plainWriteErrors) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if backendkit.CheckWrite(ctx, w) != nil {
		return leasecore.Result{}, errors.New("write refused")
	}
	return r.Resource.Write(ctx, w)
}

// writeFirst stores first and validates afterwards: the right error, too
// late. It trims the names, ignores the context, and writes what it got.
type writeFirst struct{ *memfence.Resource }

func (r writeFirst) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	invalid := backendkit.CheckWrite(ctx, w)
	clean := w
	clean.Scope, clean.Part, clean.Writer = strings.TrimSpace(w.Scope), strings.TrimSpace(w.Part), strings.TrimSpace(w.Writer)
	res, err := r.Resource.Write(context.WithoutCancel(ctx), clean)
	if invalid != nil {
		return leasecore.Result{}, invalid
	}
	return res, err
}

// renewFirst renews first and validates afterwards, in the same way.
type renewFirst struct{ *memfence.Leases }

func (l renewFirst) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	clean := g
	clean.Name, clean.Holder = strings.TrimSpace(g.Name), strings.TrimSpace(g.Holder)
	renewed, err := l.Leases.Renew(context.WithoutCancel(ctx), clean)
	if invalid := backendkit.CheckGrant(ctx, "renew", g, memfence.MinTTL); invalid != nil {
		return leasecore.Grant{}, invalid
	}
	return renewed, err
}

// brokenInput is the in-memory harness with a broken resource or lease.
type brokenInput struct {
	*memHarness
	res   func(*memfence.Resource) conformance.Resource
	lease func(*memfence.Leases) leasecore.Lease
}

func (h brokenInput) OpenResource(ctx context.Context) (conformance.Resource, error) {
	if h.res == nil {
		return h.memHarness.OpenResource(ctx)
	}
	return h.res(h.memHarness.res), nil
}

func (h brokenInput) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	if h.lease == nil {
		return h.memHarness.OpenLease(ctx)
	}
	return h.lease(h.memHarness.leases), nil
}

// writeRows is the number of X1's rows for Write.
func writeRows() int {
	n := 0
	for _, b := range conformance.BadInputCalls(conformance.BadInput{Resource: memfence.NewResource(),
		Write: leasecore.Write{Scope: "s", Part: "p", Content: "c", Writer: "w", Token: 1}}) {
		if b.Group == "write" {
			n++
		}
	}
	return n
}

func TestX1FailsBrokenInputHandling(t *testing.T) {
	for _, tc := range []struct {
		name       string
		h          func(*memHarness) brokenInput
		failed     int
		want, lack []string
	}{
		{
			name: "plain errors", failed: writeRows(),
			h: func(m *memHarness) brokenInput {
				return brokenInput{memHarness: m, res: func(r *memfence.Resource) conformance.Resource { return plainWriteErrors{r} }}
			},
			want: []string{
				`  FAIL [input] write scope empty (expected=ErrInvalidArgument naming "scope"; state unchanged, actual=got an error wrapping no sentinel: "write refused", want an error wrapping ErrInvalidArgument; state unchanged)`,
				`  FAIL [input] write content NUL (expected=ErrInvalidArgument naming "content"`,
				`  FAIL [input] write cancelled context (expected=context.Canceled naming "context canceled"; state unchanged, actual=got an error wrapping no sentinel: "write refused", want an error wrapping context.Canceled; state unchanged)`,
				`  ok   [input] acquire name empty (expected=ErrInvalidArgument naming "name"; state unchanged, actual=ErrInvalidArgument naming "name"; state unchanged)`,
				"  note Acquire, bad name 11, holder 11, ttl 5, cancelled context 1: 28 of 28 rows rejected as they must, state unchanged",
				fmt.Sprintf("  note Write, bad scope 11, part 11, writer 11, token 2, content 3, cancelled context 1: 0 of %d rows rejected", writeRows()),
			},
			lack: []string{"FAIL [input] acquire", "FAIL [input] write batch"},
		},
		{
			name: "write first", failed: 7, // scope, part, writer with a leading or trailing space; the cancelled context
			h: func(m *memHarness) brokenInput {
				return brokenInput{memHarness: m, res: func(r *memfence.Resource) conformance.Resource { return writeFirst{r} }}
			},
			want: []string{
				`  FAIL [input] write scope leading space (expected=ErrInvalidArgument naming "scope"; state unchanged, actual=ErrInvalidArgument naming "scope"; state changed: part x1-report/x1-summary: "rows=1" by "x1-host" token=1 at `,
				` -> "rows=2" by "x1-host" token=1 at `,
				`; write log 1 -> 2 entries, last "x1-report"/"x1-summary" by "x1-host" token=1 accepted=true floor=1)`,
				`  FAIL [input] write part leading space (expected=ErrInvalidArgument naming "part"; state unchanged, actual=ErrInvalidArgument naming "part"; state changed: `,
				`  FAIL [input] write writer trailing space (`,
				`  FAIL [input] write cancelled context (expected=context.Canceled naming "context canceled"; state unchanged, actual=context.Canceled naming "context canceled"; state changed: `,
				"  note Write, bad scope 11, part 11, writer 11, token 2, content 3, cancelled context 1: 32 of 39 rows rejected",
			},
			lack: []string{"FAIL [input] write scope empty"},
		},
		{
			name: "renew first", failed: 5, // name, holder with a leading or trailing space; the cancelled context
			h: func(m *memHarness) brokenInput {
				return brokenInput{memHarness: m, lease: func(l *memfence.Leases) leasecore.Lease { return renewFirst{l} }}
			},
			want: []string{
				`  FAIL [input] renew holder leading space (expected=ErrInvalidArgument naming "holder"; state unchanged, actual=ErrInvalidArgument naming "holder"; state changed: lease x1-job: remaining time grew from `,
				`  FAIL [input] renew cancelled context (`,
			},
			lack: []string{"FAIL [input] release", "FAIL [input] renew name empty"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
				h, _ := newMemHarness(ctx)
				return tc.h(h.(*memHarness)), nil
			}, "X1")
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			for _, lack := range tc.lack {
				if strings.Contains(out, lack) {
					t.Errorf("output has %q:\n%s", lack, out)
				}
			}
			if sum.Failed != tc.failed {
				t.Errorf("Summary.Failed = %d, want %d (one FAIL per broken row):\n%s", sum.Failed, tc.failed, out)
			}
		})
	}
}

// memBatchLeases gives memfence's leases an AcquireAll (one Acquire per
// name after backendkit.CheckAcquireAll), so that TestBadInputCalls has
// acquire-all rows to run.
type memBatchLeases struct{ *memfence.Leases }

func (l memBatchLeases) AcquireAll(ctx context.Context, names []string, holder string, ttl time.Duration) ([]leasecore.Grant, []error, error) {
	if err := backendkit.CheckAcquireAll(ctx, names, holder, ttl, memfence.MinTTL); err != nil {
		return nil, nil, err
	}
	grants, errs := make([]leasecore.Grant, len(names)), make([]error, len(names))
	for i, n := range names {
		grants[i], errs[i] = l.Acquire(ctx, n, holder, ttl)
	}
	return grants, errs, nil
}

// TestBadInputCalls: the exported rows have distinct names and all pass
// against memfence directly, and BadCall.Run says what is wrong.
func TestBadInputCalls(t *testing.T) {
	ctx := context.Background()
	leases := memBatchLeases{memfence.NewLeases(nil)}
	g, err := leases.Acquire(ctx, "job", "host", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	calls := conformance.BadInputCalls(conformance.BadInput{Lease: leases, Grant: g, Free: "job-2",
		Resource: memfence.NewResource(), Write: leasecore.Write{Scope: "report", Part: "sum", Content: "c", Writer: "host", Token: 1},
		Advancer: &memUser{memUserData: newMemUserData()}, Claim: leasecore.Claim{Scope: "report", Writer: "host", Token: 1},
		MinTTL: memfence.MinTTL})
	seen := map[string]bool{}
	groups := map[string]bool{}
	for _, c := range calls {
		if seen[c.Name] {
			t.Errorf("two rows named %q", c.Name)
		}
		seen[c.Name], groups[c.Group] = true, true
		if err := c.Run(ctx); err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
	}
	if len(groups) != 10 {
		t.Errorf("groups %v, want acquire, acquire all, renew, release, renew all, inspect, write, write batch, read, advance", groups)
	}

	inv := leasecore.ErrInvalidArgument
	for _, tc := range []struct {
		mention, reason string
		err             error
		want            string
	}{
		{"name", "", nil, "no error: the call succeeded"},
		{"name", "", errors.New("bad name"), `got an error wrapping no sentinel: "bad name", want an error wrapping ErrInvalidArgument`},
		{"name", "", fmt.Errorf("acquire: %w", inv), `which does not name "name"`},
		{"name", "", &leasecore.ArgError{Op: "acquire", Field: "holder", Reason: "clashes with the name"},
			`a *leasecore.ArgError for field "holder", want field "name"`},
		{"ttl", "minimum", &leasecore.ArgError{Op: "acquire", Field: "ttl", Reason: "must be positive"}, `which does not say "minimum"`},
		{"ttl", "positive", &leasecore.ArgError{Op: "acquire", Field: "ttl", Reason: "must be positive"}, ""},
	} {
		err := conformance.BadCall{Want: inv, Mention: tc.mention, Reason: tc.reason,
			Call: func(context.Context) error { return tc.err }}.Run(ctx)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Run with %v (mention %q, reason %q): got %v, want %q", tc.err, tc.mention, tc.reason, err, tc.want)
		}
	}
}

// splitBrain gives every lease client a lease service of its own: each
// campaigner believes it holds the lease alone.
type splitBrain struct{ *memHarness }

func (h splitBrain) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	return memfence.NewLeases(nil), nil
}

// TestF11FailsSplitBrainAndReusedTokens: F11 fails a lease service that
// lets two campaigners lead at once, and one that reuses tokens.
func TestF11FailsSplitBrainAndReusedTokens(t *testing.T) {
	_, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return splitBrain{h.(*memHarness)}, nil
	}, "F11")
	for _, want := range []string{
		"FAIL [I1] while the first leader leads, nobody else is elected",
		"FAIL [I1] at no moment did two campaigners lead at once (expected=1, actual=",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("split brain: output lacks %q:\n%s", want, out)
		}
	}
	_, out = report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return reusedTokenHarness{h.(*memHarness)}, nil
	}, "F11")
	if want := "FAIL [I2] the new leader holds a larger token (expected=token=2, actual=token=1)"; !strings.Contains(out, want) {
		t.Errorf("reused tokens: output lacks %q:\n%s", want, out)
	}
}

// attemptLogDeclared declares log as the memfence resources' attempt log;
// they log every check whatever it says.
type attemptLogDeclared struct {
	*memHarness
	log leasecore.AttemptLog
}

func (h attemptLogDeclared) Traits() conformance.Traits {
	t := h.memHarness.Traits()
	t.AttemptLog = h.log
	return t
}

// TestSuiteChecksDeclaredAttemptLog: X1 reads the attempt log after an
// accepted write and expects what Traits.AttemptLog declares, so a harness
// whose resources log every check but declare the default (rejected
// checks only) fails, and so does one declaring no log at all.
func TestSuiteChecksDeclaredAttemptLog(t *testing.T) {
	for _, log := range []leasecore.AttemptLog{leasecore.LogRejected, leasecore.LogNone} {
		t.Run(log.String(), func(t *testing.T) {
			sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
				h, _ := newMemHarness(ctx)
				return attemptLogDeclared{h.(*memHarness), log}, nil
			}, "X1")
			want := "want none (the harness logs attempts with " + log.String() + ")"
			if !strings.Contains(out, want) || sum.Failed == 0 {
				t.Errorf("Summary.Failed = %d; output lacks %q:\n%s", sum.Failed, want, out)
			}
		})
	}
}
