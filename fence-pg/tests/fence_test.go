package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The user's own tables, as a nightly job would have them: a header row per
// run and its lines, written together under the fence.
const userSchema = `
CREATE TABLE IF NOT EXISTS job_run (scope text PRIMARY KEY, writer text NOT NULL, token bigint NOT NULL, total int NOT NULL);
CREATE TABLE IF NOT EXISTS job_line (scope text, line int, amount int NOT NULL, PRIMARY KEY (scope, line));
TRUNCATE job_run, job_line;`

const (
	upsertRun  = `INSERT INTO job_run (scope, writer, token, total) VALUES ($1, $2, $3, $4) ON CONFLICT (scope) DO UPDATE SET writer = EXCLUDED.writer, token = EXCLUDED.token, total = EXCLUDED.total`
	upsertLine = `INSERT INTO job_line (scope, line, amount) VALUES ($1, $2, $3) ON CONFLICT (scope, line) DO UPDATE SET amount = EXCLUDED.amount`
)

// fenceFixture is a fixture whose resource database also holds the user's
// tables, and a Fence on it.
type fenceFixture struct {
	*fixture
	fence pgopen.Fence
}

func newFenceFixture(t *testing.T, driver string, opts ...fencepg.Option) fenceFixture {
	t.Helper()
	f := newFixture(t, driver)
	if _, err := f.resourceDB.Exec(context.Background(), userSchema); err != nil {
		t.Fatal(err)
	}
	return fenceFixture{f, openFence(t, f.resPool, opts...)}
}

func openFence(t *testing.T, p pgopen.Pool, opts ...fencepg.Option) pgopen.Fence {
	t.Helper()
	fence, err := p.Fence(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return fence
}

// writeJob writes the job's header and two lines with the fence (runJob),
// failing the test on an error.
func (f fenceFixture) writeJob(t *testing.T, c leasecore.Claim, total int) leasecore.Result {
	t.Helper()
	res, _, err := f.runJob(c, total)
	if err != nil {
		t.Fatalf("write job %+v: %v", c, err)
	}
	return res
}

// runJob writes the job's header and two lines with the fence, in the way
// the driver offers: Fence.RunTx on pgx, FenceDB.RunTx on database/sql.
// called reports whether RunTx called the function.
func (f fenceFixture) runJob(c leasecore.Claim, total int) (res leasecore.Result, called bool, err error) {
	ctx := context.Background()
	if f.fence.Pgx != nil {
		res, err = f.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
			called = true
			if _, err := tx.Exec(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), total); err != nil {
				return err
			}
			for line := 1; line <= 2; line++ {
				if _, err := tx.Exec(ctx, upsertLine, c.Scope, line, total*line); err != nil {
					return err
				}
			}
			return nil
		})
	} else {
		res, err = f.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
			called = true
			if _, err := tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), total); err != nil {
				return err
			}
			for line := 1; line <= 2; line++ {
				if _, err := tx.ExecContext(ctx, upsertLine, c.Scope, line, total*line); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return res, called, err
}

// floorVersion returns the floor row's xmin: it changes exactly when a new
// version of the row is written.
func (f fenceFixture) floorVersion(t *testing.T, scope string) string {
	t.Helper()
	var xmin string
	if err := f.resourceDB.QueryRow(context.Background(),
		`SELECT xmin::text FROM leasefence.fence_floor WHERE scope = $1`, scope).Scan(&xmin); err != nil {
		t.Fatal(err)
	}
	return xmin
}

// job returns the user's rows of scope as text.
func (f fenceFixture) job(t *testing.T, scope string) string {
	t.Helper()
	var s string
	err := f.resourceDB.QueryRow(context.Background(), `SELECT coalesce((SELECT writer || '/' || token || '/' || total FROM job_run WHERE scope = $1), '-')
		|| ' lines=' || coalesce((SELECT string_agg(line || ':' || amount, ',' ORDER BY line) FROM job_line WHERE scope = $1), '-')`, scope).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func wantFenceLog(t *testing.T, fence pgopen.FenceMethods, scope string, want ...string) {
	t.Helper()
	as, err := fence.Attempts(context.Background(), leasecore.AttemptQuery{Scope: scope, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(as))
	for i, a := range as {
		got[i] = fmt.Sprintf("%s/%d/%t/%d", a.Writer, a.Token, a.Accepted, a.Floor)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("attempt log of %s:\n got %q\nwant %q", scope, got, want)
	}
}

// TestFenceRun: the job's rows commit under a current token and never
// under a stale one, with RunTx of Fence (pgx) and FenceDB (database/sql); an equal
// token writes again; the default log keeps the rejection only, although
// the rejected transaction rolled back.
func TestFenceRun(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		a := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 1}
		b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 2}

		backendtest.WantResult(t, "A's first run", f.writeJob(t, a, 10), true, 1)
		// The same holding period again: the floor equals the token, and
		// the check only share-locks the floor row — no new row version.
		before := f.floorVersion(t, "nightly")
		backendtest.WantResult(t, "A again, equal token", f.writeJob(t, a, 11), true, 1)
		if after := f.floorVersion(t, "nightly"); after != before {
			t.Errorf("an equal token's check wrote a new floor row version (xmin %s -> %s): the fast path was not taken", before, after)
		}
		backendtest.WantResult(t, "B", f.writeJob(t, b, 20), true, 2)
		backendtest.WantResult(t, "A, stale", f.writeJob(t, a, 12), false, 2)
		if got, want := f.job(t, "nightly"), "holder-b/2/20 lines=1:20,2:40"; got != want {
			t.Fatalf("rows = %q, want %q (B's)", got, want)
		}
		wantFenceLog(t, f.fence, "nightly", "holder-a/1/false/2")
	})
}

// TestFenceCommitCallersTx: Commit of Fence (pgx) and FenceDB (database/sql) end
// a transaction the caller began and filled itself; with LogAll the
// accepted entry commits with the caller's rows, a transaction the caller
// rolls back instead leaves nothing, and a rejection rolls back the
// caller's rows while its log entry stays. Either way Commit leaves the
// transaction closed.
func TestFenceCommitCallersTx(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver, fencepg.WithAttemptLog(leasecore.LogAll))
		ctx := context.Background()
		// run begins a transaction, writes the header, and ends it with
		// Commit, or rolls it back itself.
		run := func(c leasecore.Claim, commit bool) leasecore.Result {
			t.Helper()
			var res leasecore.Result
			var err, closed error
			if p := f.resPool.Pgx; p != nil {
				tx, berr := p.Begin(ctx)
				if berr != nil {
					t.Fatal(berr)
				}
				if _, err = tx.Exec(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 1); err == nil && commit {
					res, err = f.fence.Pgx.Commit(ctx, tx, c)
				}
				if closed = tx.Rollback(ctx); !commit || errors.Is(closed, pgx.ErrTxClosed) {
					closed = nil
				}
			} else {
				tx, berr := f.resPool.SQL.BeginTx(ctx, nil)
				if berr != nil {
					t.Fatal(berr)
				}
				if _, err = tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 1); err == nil && commit {
					res, err = f.fence.SQL.Commit(ctx, tx, c)
				}
				if closed = tx.Rollback(); !commit || errors.Is(closed, sql.ErrTxDone) {
					closed = nil
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if closed != nil {
				t.Fatalf("%s: Rollback after Commit = %v, want the transaction closed", c.Writer, closed)
			}
			return res
		}
		run(leasecore.Claim{Scope: "s", Writer: "w3", Token: 3}, false)
		if fl, _ := f.fence.Floor(ctx, "s"); fl != 0 {
			t.Fatalf("floor after the caller rolled back = %d, want 0", fl)
		}
		backendtest.WantResult(t, "token 2", run(leasecore.Claim{Scope: "s", Writer: "w2", Token: 2}, true), true, 2)
		backendtest.WantResult(t, "token 1", run(leasecore.Claim{Scope: "s", Writer: "w1", Token: 1}, true), false, 2)
		wantFenceLog(t, f.fence, "s", "w2/2/true/2", "w1/1/false/2")
		if got := f.job(t, "s"); got != "w2/2/1 lines=-" {
			t.Fatalf("rows = %q", got)
		}
	})
}

// TestFenceSendBatch: the check and the caller's statements in one
// pipeline; a stale token aborts the whole pipeline and comes back as a
// rejection, not an error; an error in the caller's statements undoes the
// check too.
func TestFenceSendBatch(t *testing.T) {
	f := newFenceFixture(t, pgopen.Pgx)
	ctx := context.Background()
	batch := func(c leasecore.Claim, total int) *pgx.Batch {
		b := &pgx.Batch{}
		b.Queue(upsertRun, c.Scope, c.Writer, int64(c.Token), total)
		b.Queue(upsertLine, c.Scope, 1, total)
		return b
	}
	a := leasecore.Claim{Scope: "p", Writer: "holder-a", Token: 1}
	b := leasecore.Claim{Scope: "p", Writer: "holder-b", Token: 2}
	for _, step := range []struct {
		c        leasecore.Claim
		total    int
		accepted bool
		floor    leasecore.Token
	}{{a, 10, true, 1}, {b, 20, true, 2}, {a, 11, false, 2}} {
		res, err := f.fence.Pgx.SendBatch(ctx, f.resPool.Pgx, step.c, batch(step.c, step.total))
		if err != nil {
			t.Fatalf("%+v: %v", step.c, err)
		}
		backendtest.WantResult(t, fmt.Sprintf("pipeline of %s", step.c.Writer), res, step.accepted, step.floor)
	}
	if got := f.job(t, "p"); got != "holder-b/2/20 lines=1:20" {
		t.Fatalf("rows = %q, want B's", got)
	}
	wantFenceLog(t, f.fence, "p", "holder-a/1/false/2")

	// A failing statement of the caller's: none of its statements stay.
	// Token 3 is new to the scope, so SendBatch advanced the floor to it
	// before sending the pipeline again (its fast path passes only when the
	// floor equals the token); that advance stays.
	c := leasecore.Claim{Scope: "p", Writer: "holder-c", Token: 3}
	bad := batch(c, 30)
	bad.Queue(`INSERT INTO job_line (scope, line, amount) VALUES ($1, 1, NULL)`, c.Scope)
	if _, err := f.fence.Pgx.SendBatch(ctx, f.resPool.Pgx, c, bad); err == nil || !strings.Contains(err.Error(), "null value") {
		t.Fatalf("batch with a failing statement: err = %v, want the not-null violation", err)
	}
	if fl, _ := f.fence.Floor(ctx, "p"); fl != 3 {
		t.Fatalf("floor after the failed pipeline = %d, want 3 (advanced before it was sent again)", fl)
	}
	if got := f.job(t, "p"); got != "holder-b/2/20 lines=1:20" {
		t.Fatalf("rows after the failed pipeline = %q", got)
	}
}

// TestFenceAdvance: a new holder advances the floor right after it
// acquires; from then on the old holder is rejected, also for rows the new
// holder has not written. A stale advance changes nothing.
func TestFenceAdvance(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx := context.Background()
		a := leasecore.Claim{Scope: "adv", Writer: "holder-a", Token: 1}
		b := leasecore.Claim{Scope: "adv", Writer: "holder-b", Token: 2}
		backendtest.WantResult(t, "A writes", f.writeJob(t, a, 1), true, 1)
		res, err := f.fence.Advance(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		backendtest.WantResult(t, "B advances", res, true, 2)
		backendtest.WantResult(t, "A writes after B advanced", f.writeJob(t, a, 2), false, 2)
		res, err = f.fence.Advance(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		backendtest.WantResult(t, "A advances, stale", res, false, 2)
		if got := f.job(t, "adv"); got != "holder-a/1/1 lines=1:1,2:2" {
			t.Fatalf("rows = %q, want A's first run only", got)
		}
		wantFenceLog(t, f.fence, "adv", "holder-a/1/false/2", "holder-a/1/false/2")
	})
}

// TestFenceRace: writers with tokens 1..8 behind a barrier, each its own
// transaction on its own connection. Whatever the order, the rows end as
// the largest token's, and every writer below a token that had committed
// before it checked was rejected (I3).
func TestFenceRace(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		for round := range 5 {
			f := newFenceFixture(t, driver, fencepg.WithAttemptLog(leasecore.LogAll))
			var wg sync.WaitGroup
			start := make(chan struct{})
			for tok := 1; tok <= 8; tok++ {
				wg.Go(func() {
					<-start
					f.writeJob(t, leasecore.Claim{Scope: "race", Writer: fmt.Sprintf("w%d", tok), Token: leasecore.Token(tok)}, tok)
				})
			}
			close(start)
			wg.Wait()
			if got := f.job(t, "race"); got != "w8/8/8 lines=1:8,2:16" {
				t.Fatalf("round %d: rows = %q, want token 8's", round, got)
			}
			// In log order (the order the checks took the floor lock),
			// accepted tokens never decrease.
			as, err := f.fence.Attempts(context.Background(), leasecore.AttemptQuery{Scope: "race", Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			var last leasecore.Token
			for _, a := range as {
				if a.Accepted && a.Token < last {
					t.Fatalf("round %d: token %d accepted after %d: %+v", round, a.Token, last, as)
				}
				if a.Accepted {
					last = a.Token
				}
			}
		}
	})
}

// TestFenceLogModes: LogNone records nothing, LogAll records every check.
func TestFenceLogModes(t *testing.T) {
	f := newFenceFixture(t, pgopen.Pgx, fencepg.WithAttemptLog(leasecore.LogNone))
	f.writeJob(t, leasecore.Claim{Scope: "n", Writer: "b", Token: 2}, 1)
	f.writeJob(t, leasecore.Claim{Scope: "n", Writer: "a", Token: 1}, 1)
	wantFenceLog(t, f.fence, "n")
	all := fenceFixture{f.fixture, openFence(t, f.resPool, fencepg.WithAttemptLog(leasecore.LogAll))}
	all.writeJob(t, leasecore.Claim{Scope: "n", Writer: "b", Token: 2}, 1)
	all.writeJob(t, leasecore.Claim{Scope: "n", Writer: "a", Token: 1}, 1)
	wantFenceLog(t, all.fence, "n", "b/2/true/2", "a/1/false/2")
}

// TestFenceAttemptsReadAndPrune: reads take a time bound and a limit;
// prune deletes what is older than its bound, in one scope only.
func TestFenceAttemptsReadAndPrune(t *testing.T) {
	f := newFenceFixture(t, pgopen.Pgx, fencepg.WithAttemptLog(leasecore.LogAll))
	ctx := context.Background()
	for tok := 1; tok <= 3; tok++ {
		f.writeJob(t, leasecore.Claim{Scope: "log", Writer: "w", Token: leasecore.Token(tok)}, tok)
		f.writeJob(t, leasecore.Claim{Scope: "other", Writer: "w", Token: leasecore.Token(tok)}, tok)
	}
	var mid time.Time
	if err := f.resourceDB.QueryRow(ctx, `SELECT attempted_at FROM leasefence.write_attempt WHERE scope = 'log' AND token = 2`).Scan(&mid); err != nil {
		t.Fatal(err)
	}
	as, err := f.fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "log", Since: mid, Limit: 1})
	if err != nil || len(as) != 1 || as[0].Token != 2 {
		t.Fatalf("since token 2's entry, limit 1: %+v, %v", as, err)
	}
	n, err := f.fence.PruneAttempts(ctx, "log", mid)
	if err != nil || n != 1 {
		t.Fatalf("prune before token 2's entry: n=%d err=%v, want 1", n, err)
	}
	wantFenceLog(t, f.fence, "log", "w/2/true/2", "w/3/true/3")
	wantFenceLog(t, f.fence, "other", "w/1/true/1", "w/2/true/2", "w/3/true/3")
}

// TestFenceBadInput: every entry point names the bad field, wraps
// leasecore.ErrInvalidArgument and changes nothing; fn is never called.
func TestFenceBadInput(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx := context.Background()
		before := f.snapshot(t) + f.job(t, "s")
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		good := leasecore.Claim{Scope: "s", Writer: "w", Token: 1}
		called := false
		pgxFn := func(pgx.Tx) error { called = true; return nil }
		sqlFn := func(*sql.Tx) error { called = true; return nil }
		run := func(ctx context.Context, c leasecore.Claim) error {
			if f.fence.Pgx != nil {
				_, err := f.fence.Pgx.RunTx(ctx, c, pgxFn)
				return err
			}
			_, err := f.fence.SQL.RunTx(ctx, c, sqlFn)
			return err
		}
		type badCall struct {
			name, field string
			call        func() error
		}
		cases := []badCall{
			{"empty scope", "scope", func() error { return run(ctx, leasecore.Claim{Writer: "w", Token: 1}) }},
			{"long writer", "writer", func() error {
				return run(ctx, leasecore.Claim{Scope: "s", Writer: strings.Repeat("w", backendkit.MaxNameLen+1), Token: 1})
			}},
			{"token 0", "token", func() error { return run(ctx, leasecore.Claim{Scope: "s", Writer: "w"}) }},
			{"cancelled ctx", "ctx", func() error { return run(cancelled, good) }},
			{"advance NUL scope", "scope", func() error {
				_, err := f.fence.Advance(ctx, leasecore.Claim{Scope: "a\x00b", Writer: "w", Token: 1})
				return err
			}},
			{"advance token 0", "token", func() error {
				_, err := f.fence.Advance(ctx, leasecore.Claim{Scope: "s", Writer: "w"})
				return err
			}},
			{"nil fn", "fn", func() error {
				if f.fence.Pgx != nil {
					_, err := f.fence.Pgx.RunTx(ctx, good, nil)
					return err
				}
				_, err := f.fence.SQL.RunTx(ctx, good, nil)
				return err
			}},
			{"nil tx", "tx", func() error {
				if f.fence.Pgx != nil {
					_, err := f.fence.Pgx.Commit(ctx, nil, good)
					return err
				}
				_, err := f.fence.SQL.Commit(ctx, nil, good)
				return err
			}},
			{"commit token 0", "token", func() error {
				if f.fence.Pgx != nil {
					_, err := f.fence.Pgx.Commit(ctx, txSender{}, leasecore.Claim{Scope: "s", Writer: "w"})
					return err
				}
				_, err := f.fence.SQL.Commit(ctx, nil, leasecore.Claim{Scope: "s", Writer: "w"})
				return err
			}},
			{"attempts limit 0", "limit", func() error {
				_, err := f.fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "s"})
				return err
			}},
			{"prune in the future", "before", func() error {
				_, err := f.fence.PruneAttempts(ctx, "s", time.Now().Add(time.Hour))
				return err
			}},
			{"prune empty scope", "scope", func() error { _, err := f.fence.PruneAttempts(ctx, "", time.Now()); return err }},
			{"bad log mode", "attempt log", func() error {
				_, err := fencepg.NewFence(f.resPool.Pgx, fencepg.WithAttemptLog(leasecore.AttemptLog(7)))
				if f.resPool.Pgx == nil {
					_, err = fencepg.NewFenceDB(f.resPool.SQL, fencepg.WithAttemptLog(leasecore.AttemptLog(7)))
				}
				return err
			}},
			{"negative lock timeout", "lock timeout", func() error {
				_, err := fencepg.NewFenceDB(f.resPool.SQL, fencepg.WithTimeouts(-time.Second, 0))
				if f.resPool.SQL == nil {
					_, err = fencepg.NewFence(f.resPool.Pgx, fencepg.WithTimeouts(-time.Second, 0))
				}
				return err
			}},
			{"nil pool", "pool", func() error { _, err := fencepg.NewFence(nil); return err }},
			{"nil db", "db", func() error { _, err := fencepg.NewFenceDB(nil); return err }},
		}
		if fence := f.fence.Pgx; fence != nil { // SendBatch is pgx's
			cases = append(cases,
				badCall{"nil batch", "batch", func() error { _, err := fence.SendBatch(ctx, nilSender{}, good, nil); return err }},
				badCall{"batch on a transaction", "sender", func() error { _, err := fence.SendBatch(ctx, txSender{}, good, &pgx.Batch{}); return err }},
				badCall{"batch token 0", "token", func() error {
					_, err := fence.SendBatch(ctx, nilSender{}, leasecore.Claim{Scope: "s", Writer: "w"}, &pgx.Batch{})
					return err
				}})
		}
		for _, tc := range cases {
			err := tc.call()
			var ae *leasecore.ArgError
			if tc.field == "ctx" {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%s: err = %v, want context.Canceled", tc.name, err)
				}
			} else if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != tc.field {
				t.Errorf("%s: err = %v, want an ArgError naming %q", tc.name, err, tc.field)
			}
		}
		if called {
			t.Error("fn was called for bad input")
		}
		if after := f.snapshot(t) + f.job(t, "s"); after != before {
			t.Errorf("bad input changed the database:\nbefore %s\nafter %s", before, after)
		}
	})
}

// nilSender fails the test if anything is sent: bad input sends nothing.
type nilSender struct{}

func (nilSender) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	panic("bad input reached SendBatch")
}

// txSender is a pgx.Tx on which every call panics: bad input sends
// nothing, and SendBatch refuses a transaction before using it.
type txSender struct{ pgx.Tx }

func (txSender) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	panic("bad input reached SendBatch")
}

// TestResourceFastPath: the part store is built on the same check: a
// second write of the same holding period stores its part under a share
// lock of the floor row (no new floor version, no log entry by default);
// a stale write is still rejected and logged.
func TestResourceFastPath(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		res, err := func() (*fencepg.Resource, error) {
			if f.resPool.Pgx != nil {
				return fencepg.NewResource(f.resPool.Pgx)
			}
			return fencepg.NewResourceDB(f.resPool.SQL)
		}()
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		write := func(part string, tok leasecore.Token) leasecore.Result {
			r, err := res.Write(ctx, leasecore.Write{Scope: "s", Part: part, Content: part, Writer: "w", Token: tok})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		backendtest.WantResult(t, "first write", write("a", 2), true, 2)
		before := f.floorVersion(t, "s")
		backendtest.WantResult(t, "same token, other part", write("b", 2), true, 2)
		b2, err := res.WriteBatch(ctx, leasecore.Batch{Scope: "s", Writer: "w", Token: 2,
			Parts: []leasecore.PartContent{{Part: "c", Content: "c"}, {Part: "d", Content: "d"}}})
		if err != nil {
			t.Fatal(err)
		}
		backendtest.WantResult(t, "same token, batch", b2, true, 2)
		if after := f.floorVersion(t, "s"); after != before {
			t.Errorf("equal-token writes wrote a new floor version (xmin %s -> %s)", before, after)
		}
		backendtest.WantPart(t, res, "s", "d", "d", "w", 2)
		backendtest.WantResult(t, "stale", write("e", 1), false, 2)
		wantFenceLog(t, f.fence, "s", "w/1/false/2")
	})
}

// TestRunTxContextCause: a transaction run under a context that ends with
// a cause (a session's context ends with ErrLocalDeadline or ErrLost)
// returns an error that wraps both the context's error and the cause, and
// commits nothing.
func TestRunTxContextCause(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx, cancel := context.WithCancelCause(context.Background())
		c := leasecore.Claim{Scope: "cause", Writer: "holder-a", Token: 1}
		var err error
		if f.fence.Pgx != nil {
			_, err = f.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
				cancel(leasecore.ErrLocalDeadline)
				_, err := tx.Exec(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 1)
				return err
			})
		} else {
			_, err = f.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
				cancel(leasecore.ErrLocalDeadline)
				_, err := tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 1)
				return err
			})
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(err, leasecore.ErrLocalDeadline) {
			t.Fatalf("RunTx under a context cancelled with a cause: %v, want it to wrap context.Canceled and ErrLocalDeadline", err)
		}
		t.Logf("%v", err)
		if got := f.job(t, "cause"); got != "- lines=-" {
			t.Fatalf("rows = %q, want none", got)
		}
	})
}

// TestRunTxEarlyRead: a Fence reads the floor before fn only until it has
// seen the floor at the claim's token: the holder's later transactions
// skip the read, so a newer token that passed meanwhile is caught by the
// comparison at commit (fn ran, nothing of it is kept), and the next
// transaction of the stale token is rejected before fn runs.
func TestRunTxEarlyRead(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx := context.Background()
		a := leasecore.Claim{Scope: "early", Writer: "holder-a", Token: 1}
		run := func(fence pgopen.Fence, c leasecore.Claim, total int) (leasecore.Result, bool) {
			t.Helper()
			called := false
			write := func(exec func(string, ...any) error) error {
				called = true
				return exec(upsertRun, c.Scope, c.Writer, int64(c.Token), total)
			}
			var res leasecore.Result
			var err error
			if fence.Pgx != nil {
				res, err = fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
					return write(func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err })
				})
			} else {
				res, err = fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
					return write(func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err })
				})
			}
			if err != nil {
				t.Fatal(err)
			}
			return res, called
		}
		res, called := run(f.fence, a, 1)
		backendtest.WantResult(t, "A's first transaction", res, true, 1)
		if !called {
			t.Fatal("A's first transaction did not run fn")
		}
		// Another instance's Fence: B advances.
		other := openFence(t, f.resPool)
		if r, err := other.Advance(ctx, leasecore.Claim{Scope: "early", Writer: "holder-b", Token: 2}); err != nil || !r.Accepted {
			t.Fatalf("B's advance: %+v %v", r, err)
		}
		res, called = run(f.fence, a, 2)
		backendtest.WantResult(t, "A's transaction after B advanced, its Fence having seen the floor at A's token", res, false, 2)
		if !called {
			t.Error("fn did not run: the Fence read the floor first, which it need not have")
		}
		res, called = run(f.fence, a, 3)
		backendtest.WantResult(t, "A's next transaction", res, false, 2)
		if called {
			t.Error("fn ran although the Fence had seen the floor at 2: the early read was skipped")
		}
		if got := f.job(t, "early"); got != "holder-a/1/1 lines=-" {
			t.Fatalf("rows = %q, want A's first transaction's only", got)
		}
	})
}

// TestRunTxIdleTimeout: RunTx's idle-in-transaction timeout is in force
// inside fn in the holder's first transaction, where it travels with the
// early read of the floor, and in the later ones, where the Fence has seen
// the floor at the token and sends it alone after BEGIN; and only there:
// afterwards the connection has the server's value again.
func TestRunTxIdleTimeout(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver, fencepg.WithTimeouts(0, 1500*time.Millisecond))
		ctx := context.Background()
		c := leasecore.Claim{Scope: "idle", Writer: "holder-a", Token: 1}
		const show = `SELECT current_setting('idle_in_transaction_session_timeout')`
		for _, which := range []string{"first (early read)", "second (floor seen)", "third (floor seen)"} {
			var idle string
			var res leasecore.Result
			var err error
			if f.fence.Pgx != nil {
				res, err = f.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error { return tx.QueryRow(ctx, show).Scan(&idle) })
			} else {
				res, err = f.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error { return tx.QueryRowContext(ctx, show).Scan(&idle) })
			}
			if err != nil || !res.Accepted {
				t.Fatalf("%s transaction: %+v, %v", which, res, err)
			}
			if idle != "1500ms" {
				t.Errorf("%s transaction: idle_in_transaction_session_timeout = %s inside fn, want 1500ms", which, idle)
			}
		}
		// Statements on the pool afterwards: the server's value.
		for i := range 4 {
			var idle string
			if err := f.resourceDB.QueryRow(ctx, show).Scan(&idle); err != nil {
				t.Fatal(err)
			}
			if idle != "0" {
				t.Errorf("statement %d after the fenced transactions: idle_in_transaction_session_timeout = %s, want the server's 0", i, idle)
			}
		}
	})
}
