package fencepg_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// write writes and fails the test on error.
func write(t *testing.T, r leasecore.FencedResource, scope, part, content, writer string, token leasecore.Token) leasecore.Result {
	t.Helper()
	res, err := r.Write(context.Background(), leasecore.Write{
		Scope: scope, Part: part, Content: content, Writer: writer, Token: token})
	if err != nil {
		t.Fatalf("write %s/%s token %d: %v", scope, part, token, err)
	}
	return res
}

func wantResult(t *testing.T, what string, got leasecore.Result, accepted bool, floor leasecore.Token) {
	t.Helper()
	if got.Accepted != accepted || got.Floor != floor {
		t.Fatalf("%s: got %+v, want accepted=%v floor=%d", what, got, accepted, floor)
	}
}

// wantPart checks the stored part; content "" means absent.
func wantPart(t *testing.T, r leasecore.ResourceReader, scope, part, content, writer string, token leasecore.Token) {
	t.Helper()
	p, ok, err := r.ReadPart(context.Background(), scope, part)
	if err != nil {
		t.Fatal(err)
	}
	if content == "" {
		if ok {
			t.Fatalf("part %s/%s: got %+v, want absent", scope, part, p)
		}
		return
	}
	if !ok || p.Scope != scope || p.Part != part || p.Content != content || p.Writer != writer || p.Token != token ||
		p.WrittenAt.IsZero() {
		t.Fatalf("part %s/%s: got %+v (ok=%v), want %q by %s token %d", scope, part, p, ok, content, writer, token)
	}
}

func wantFloor(t *testing.T, r leasecore.ResourceReader, scope string, want leasecore.Token) {
	t.Helper()
	got, err := r.Floor(context.Background(), scope)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("floor of %s: got %d, want %d", scope, got, want)
	}
}

// attemptsString renders a scope's write log compactly:
// "part/writer/token/accepted/floor" per attempt.
func attemptsString(t *testing.T, r leasecore.ResourceReader, scope string) []string {
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

func wantAttempts(t *testing.T, r leasecore.ResourceReader, scope string, want ...string) {
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

		wantFloor(t, r, scope, 0)
		wantResult(t, "first write", write(t, r, scope, "summary", "a1", "holder-a", 1), true, 1)
		wantResult(t, "equal token", write(t, r, scope, "summary", "a2", "holder-a", 1), true, 1)
		wantPart(t, r, scope, "summary", "a2", "holder-a", 1)
		wantResult(t, "newer token", write(t, r, scope, "summary", "b1", "holder-b", 2), true, 2)

		snap := f.snapshot(t)
		wantResult(t, "stale token", write(t, r, scope, "summary", "stale", "holder-a", 1), false, 2)
		wantResult(t, "stale token, other part", write(t, r, scope, "detail", "stale", "holder-a", 1), false, 2)
		wantPart(t, r, scope, "summary", "b1", "holder-b", 2)
		wantPart(t, r, scope, "detail", "", "", 0)
		if got := f.snapshot(t); got == snap {
			t.Fatal("rejected writes were not logged")
		}

		// Scopes are independent; a scope seen for the first time accepts.
		wantResult(t, "new scope", write(t, r, "other-report", "detail", "a", "holder-a", 1), true, 1)
		wantFloor(t, r, scope, 2)
		wantFloor(t, r, "other-report", 1)
		wantFloor(t, r, "never-written", 0)
		wantPart(t, r, "never-written", "summary", "", "", 0)

		wantAttempts(t, r, scope,
			"summary/holder-a/1/true/1", "summary/holder-a/1/true/1", "summary/holder-b/2/true/2",
			"summary/holder-a/1/false/2", "detail/holder-a/1/false/2")
		wantAttempts(t, r, "other-report", "detail/holder-a/1/true/1")
		wantAttempts(t, r, "never-written")

		// The largest token fits.
		wantResult(t, "MaxToken", write(t, r, "max", "p", "x", "w", leasecore.MaxToken), true, leasecore.MaxToken)
		wantResult(t, "below MaxToken", write(t, r, "max", "p", "y", "w", leasecore.MaxToken-1), false, leasecore.MaxToken)
	})
}

// TestFenceQueuesWriters pins the interleaving of SPEC F6b on the real
// server: writer A runs the fence statement and pauses before COMMIT
// (WithCommitGap); writer B's statement on the same scope must block on
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
					write(t, f.res, scope, "summary", "seed", "holder-s", tc.seed)
				}
				entered, resume := make(chan struct{}), make(chan struct{})
				gapped, err := f.resPool.Resource(fencepg.WithCommitGap(func(ctx context.Context, w leasecore.Write) error {
					close(entered)
					<-resume
					return nil
				}))
				if err != nil {
					t.Fatal(err)
				}
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
				wantResult(t, "first", a.res, tc.firstAccepted, tc.firstFloor)
				wantResult(t, "second", b.res, tc.secondAccepted, tc.floor)
				wantFloor(t, f.res, scope, tc.floor)
				if tc.secondAccepted {
					wantPart(t, f.res, scope, "summary", "second", "second", tc.second)
				} else {
					wantPart(t, f.res, scope, "summary", "first", "first", tc.first)
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
			wantFloor(t, f.res, scope, 2)
			wantPart(t, f.res, scope, "summary", "token 2", "w2", 2)
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
