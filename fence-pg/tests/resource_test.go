package fencepg_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/leasefence/leasefence/conformance/backendtest"
	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// attemptsString renders a scope's write log compactly:
// "part/writer/token/accepted/floor" per attempt.
func attemptsString(t *testing.T, r backendkit.ResourceReader, scope string) []string {
	t.Helper()
	as, err := r.Attempts(context.Background(), scope)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		if a.Scope != scope || a.At.IsZero() {
			t.Fatalf("attempt %+v: wrong scope or no time", a)
		}
		out = append(out, fmt.Sprintf("%s/%s/%d/%v/%d", a.Part, a.Writer, a.Token, a.Accepted, a.Floor))
	}
	return out
}

func wantAttempts(t *testing.T, r backendkit.ResourceReader, scope string, want ...string) {
	t.Helper()
	got := attemptsString(t, r, scope)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("attempts of %s:\n got %q\nwant %q", scope, got, want)
	}
}

func TestFencedWrite(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		const scope = "daily-report"
		r := f.res

		backendtest.WantFloor(t, r, scope, 0)
		backendtest.WantResult(t, "first write", backendtest.Write(t, r, scope, "summary", "a1", "holder-a", 1), true, 1)
		backendtest.WantResult(t, "equal token", backendtest.Write(t, r, scope, "summary", "a2", "holder-a", 1), true, 1)
		backendtest.WantPart(t, r, scope, "summary", "a2", "holder-a", 1)
		backendtest.WantResult(t, "newer token", backendtest.Write(t, r, scope, "summary", "b1", "holder-b", 2), true, 2)

		snap := f.snapshot(t)
		backendtest.WantResult(t, "stale token", backendtest.Write(t, r, scope, "summary", "stale", "holder-a", 1), false, 2)
		backendtest.WantResult(t, "stale token, other part", backendtest.Write(t, r, scope, "detail", "stale", "holder-a", 1), false, 2)
		backendtest.WantPart(t, r, scope, "summary", "b1", "holder-b", 2)
		backendtest.WantPart(t, r, scope, "detail", "", "", 0)
		if got := f.snapshot(t); got == snap {
			t.Fatal("rejected writes were not logged")
		}

		// Scopes are independent; a scope seen for the first time accepts.
		backendtest.WantResult(t, "new scope", backendtest.Write(t, r, "other-report", "detail", "a", "holder-a", 1), true, 1)
		backendtest.WantFloor(t, r, scope, 2)
		backendtest.WantFloor(t, r, "other-report", 1)
		backendtest.WantFloor(t, r, "never-written", 0)
		backendtest.WantPart(t, r, "never-written", "summary", "", "", 0)

		wantAttempts(t, r, scope,
			"summary/holder-a/1/true/1", "summary/holder-a/1/true/1", "summary/holder-b/2/true/2",
			"summary/holder-a/1/false/2", "detail/holder-a/1/false/2")
		wantAttempts(t, r, "other-report", "detail/holder-a/1/true/1")
		wantAttempts(t, r, "never-written")

		// The largest token fits.
		backendtest.WantResult(t, "MaxToken", backendtest.Write(t, r, "max", "p", "x", "w", backendkit.MaxToken), true, backendkit.MaxToken)
		backendtest.WantResult(t, "below MaxToken", backendtest.Write(t, r, "max", "p", "y", "w", backendkit.MaxToken-1), false, backendkit.MaxToken)
	})
}

// TestFenceQueuesWriters pins the interleaving of conformance case F6b on the real
// server: writer A runs the fence statement and pauses before COMMIT
// (internal/commitgap); writer B's statement on the same scope must block on
// the lock A holds (seen in pg_stat_activity), and after A commits B
// compares with the floor A committed. Both orders, for a new scope (the
// INSERT branch: B waits on the unique index) and an existing one (the
// UPDATE branch: B waits on the row) — also when A is rejected: its
// statement still updates, and so locks, the floor row.
func TestFenceQueuesWriters(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		for _, tc := range []struct {
			name                          string
			seed                          leasecore.Token // 0: the scope is new
			first, second                 leasecore.Token
			firstAccepted, secondAccepted bool
			firstFloor, floor             leasecore.Token
		}{
			{name: "new scope, older first", first: 1, second: 2, firstAccepted: true, secondAccepted: true, firstFloor: 1, floor: 2},
			{name: "new scope, newer first", first: 2, second: 1, firstAccepted: true, secondAccepted: false, firstFloor: 2, floor: 2},
			{name: "existing scope, older first", seed: 1, first: 2, second: 3, firstAccepted: true, secondAccepted: true, firstFloor: 2, floor: 3},
			{name: "existing scope, newer first", seed: 1, first: 3, second: 2, firstAccepted: true, secondAccepted: false, firstFloor: 3, floor: 3},
			{name: "existing scope, rejected first", seed: 2, first: 1, second: 3, firstAccepted: false, secondAccepted: true, firstFloor: 2, floor: 3},
		} {
			t.Run(tc.name, func(t *testing.T) {
				scope := "scope " + tc.name
				if tc.seed != 0 {
					backendtest.Write(t, f.res, scope, "summary", "seed", "holder-s", tc.seed)
				}
				entered, resume := make(chan struct{}), make(chan struct{})
				plain, err := f.resPool.Resource()
				if err != nil {
					t.Fatal(err)
				}
				gapped := commitgap.Wrap(plain, func(ctx context.Context, w leasecore.Write) error {
					close(entered)
					<-resume
					return nil
				})
				type outcome struct {
					res leasecore.Result
					err error
				}
				firstDone, secondDone := make(chan outcome, 1), make(chan outcome, 1)
				go func() {
					res, err := gapped.Write(context.Background(), leasecore.Write{
						Scope: scope, Part: "summary", Content: "first", Writer: "first", Token: tc.first})
					firstDone <- outcome{res, err}
				}()
				<-entered // A has advanced the floor and holds its lock, uncommitted
				go func() {
					res, err := f.res.Write(context.Background(), leasecore.Write{
						Scope: scope, Part: "summary", Content: "second", Writer: "second", Token: tc.second})
					secondDone <- outcome{res, err}
				}()
				wait := f.waitLockWaiter(t)
				t.Logf("second writer waits: %s", wait)
				select {
				case o := <-secondDone:
					t.Fatalf("second writer finished while the first held the floor: %+v", o)
				default:
				}
				close(resume)
				a, b := <-firstDone, <-secondDone
				if a.err != nil || b.err != nil {
					t.Fatalf("errors: first %v, second %v", a.err, b.err)
				}
				backendtest.WantResult(t, "first", a.res, tc.firstAccepted, tc.firstFloor)
				backendtest.WantResult(t, "second", b.res, tc.secondAccepted, tc.floor)
				backendtest.WantFloor(t, f.res, scope, tc.floor)
				if tc.secondAccepted {
					backendtest.WantPart(t, f.res, scope, "summary", "second", "second", tc.second)
				} else {
					backendtest.WantPart(t, f.res, scope, "summary", "first", "first", tc.first)
				}
			})
		}
	})
}

// TestConcurrentFirstWrite races two writers of a scope nobody wrote yet,
// many times: no unique violation, the floor ends at the larger token, the
// larger token's content is what stays, and the accepted tokens in log
// order never decrease (I3).
func TestConcurrentFirstWrite(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		const rounds = 40
		for i := range rounds {
			scope := fmt.Sprintf("race-%d", i)
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for j, token := range []leasecore.Token{1, 2} {
				wg.Go(func() {
					<-start
					_, errs[j] = f.res.Write(ctx, leasecore.Write{Scope: scope, Part: "summary",
						Content: fmt.Sprint("token ", token), Writer: fmt.Sprint("w", token), Token: token})
				})
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
			}
			backendtest.WantFloor(t, f.res, scope, 2)
			backendtest.WantPart(t, f.res, scope, "summary", "token 2", "w2", 2)
			as, err := f.res.Attempts(ctx, scope)
			if err != nil {
				t.Fatal(err)
			}
			var last leasecore.Token
			for _, a := range as {
				if a.Accepted && a.Token < last {
					t.Fatalf("round %d: accepted token %d after %d: %q", i, a.Token, last, attemptsString(t, f.res, scope))
				}
				if a.Accepted {
					last = a.Token
				}
			}
		}
	})
}
