package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// Resource.Write gathers concurrent fast-path writes into shared statements
// (fencepg's writeBatcher: at most two statements in flight per Resource,
// the writes that arrive meanwhile queued and sent together). These tests
// take both places with two writes held on a row lock, so that what comes
// next is queued, and look at what the queue's statement did.

// writeOutcome is one Write's answer.
type writeOutcome struct {
	name string
	res  leasecore.Result
	err  error
}

// startWrite runs res.Write in a goroutine; its outcome goes to out.
func startWrite(ctx context.Context, res *fencepg.Resource, name string, w leasecore.Write, out chan<- writeOutcome) {
	go func() {
		r, err := res.Write(ctx, w)
		out <- writeOutcome{name, r, err}
	}()
}

// newGatheringResource returns a fixture and a Resource with the default
// attempt log (the fixture's own logs every attempt, which sends every
// write to the full check and past the gathering) on a pool of its own
// with conns connections.
func newGatheringResource(t *testing.T, driver string, conns int) (*fixture, pgopen.Pool, *fencepg.Resource) {
	t.Helper()
	f := newFixture(t, driver)
	pool := pgtest.Open(t, driver, f.resDSN, conns)
	res, err := pool.Resource()
	if err != nil {
		t.Fatal(err)
	}
	return f, pool, res
}

// holdBothPlaces writes parts p1 and p2 of scope "blocker" while a
// transaction holds their rows locked, so both of res's fast-path
// statements wait; it returns once both wait on the server. release
// commits the transaction and waits for the two writes, which must be
// accepted.
func holdBothPlaces(t *testing.T, db dbx.DB, res *fencepg.Resource) (release func()) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []string{"p1", "p2"} {
		backendtest.Write(t, res, "blocker", p, "seed", "holder-b", 5)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // after a failure, so that the pool can close
	if _, err := tx.Exec(ctx, `SELECT FROM leasefence.report_part WHERE scope = 'blocker' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	held := make(chan writeOutcome, 2)
	for _, p := range []string{"p1", "p2"} {
		startWrite(ctx, res, p, leasecore.Write{Scope: "blocker", Part: p, Content: "held", Writer: "holder-b", Token: 5}, held)
	}
	waitLockWaiters(t, db, 2)
	return func() {
		t.Helper()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			o := <-held
			if o.err != nil || !o.res.Accepted {
				t.Fatalf("held write %s: %+v, %v", o.name, o.res, o.err)
			}
		}
	}
}

// waitLockWaiters waits until n fence statements of db's database wait
// for a lock.
func waitLockWaiters(t *testing.T, db dbx.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM (`+pgsql.LockWaits+`) AS w`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d fence statements wait for a lock after 10s, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wantNone fails if a write finished.
func wantNone(t *testing.T, out <-chan writeOutcome, why string) {
	t.Helper()
	select {
	case o := <-out:
		t.Fatalf("write %s finished %s: %+v, %v", o.name, why, o.res, o.err)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestWriteBatchSharesStatement queues writes behind two held ones: once
// the hold ends, one statement stores every queued write of a distinct
// part (their rows share one transaction id), a second write of a part
// waits for the next statement, a stale token is rejected and a newer one
// accepted (both through the full check), and a caller whose ctx ended
// while queued gets ctx's error at once and stores nothing.
func TestWriteBatchSharesStatement(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f, _, res := newGatheringResource(t, driver, 8)
		ctx := context.Background()
		const n = 20
		scope := func(i int) string { return fmt.Sprintf("batch-%02d", i) }
		for i := range n {
			backendtest.Write(t, res, scope(i), "summary", "seed", "holder-a", 5)
		}
		release := holdBothPlaces(t, f.resourceDB, res)

		out := make(chan writeOutcome, n+3)
		for i := range n {
			startWrite(ctx, res, scope(i), leasecore.Write{Scope: scope(i), Part: "summary", Content: "batched", Writer: "holder-a", Token: 5}, out)
		}
		startWrite(ctx, res, "again", leasecore.Write{Scope: scope(0), Part: "summary", Content: "batched again", Writer: "holder-a", Token: 5}, out)
		startWrite(ctx, res, "stale", leasecore.Write{Scope: scope(1), Part: "stale", Content: "stale", Writer: "holder-old", Token: 4}, out)
		startWrite(ctx, res, "newer", leasecore.Write{Scope: scope(2), Part: "newer", Content: "newer", Writer: "holder-new", Token: 6}, out)
		cctx, cancel := context.WithCancel(ctx)
		gone := make(chan writeOutcome, 1)
		startWrite(cctx, res, "cancelled", leasecore.Write{Scope: scope(3), Part: "cancelled", Content: "cancelled", Writer: "holder-a", Token: 5}, gone)
		wantNone(t, out, "while both statement places were held")
		cancel()
		select {
		case o := <-gone:
			if !errors.Is(o.err, context.Canceled) {
				t.Fatalf("cancelled queued write: %+v, %v; want context.Canceled", o.res, o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a queued write did not return within 5s of its ctx's end")
		}
		release()

		got := map[string]writeOutcome{}
		for range n + 3 {
			o := <-out
			got[o.name] = o
		}
		for name, o := range got {
			if o.err != nil {
				t.Fatalf("write %s: %v", name, o.err)
			}
			switch name {
			case "stale":
				backendtest.WantResult(t, name, o.res, false, 5)
			case "newer":
				backendtest.WantResult(t, name, o.res, true, 6)
			default:
				backendtest.WantResult(t, name, o.res, true, 5)
			}
		}
		// The writes of distinct parts were queued together: one statement,
		// one transaction. Had the second write of batch-00/summary gone
		// into that statement too, the upsert would have failed ("cannot
		// affect row a second time") and every write would have been sent
		// alone. (Which of the two is stored last is not known: the second
		// place may start its statement first.)
		var txids int
		if err := f.resourceDB.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM leasefence.report_part
			WHERE scope LIKE 'batch-%' AND scope <> 'batch-00' AND part = 'summary'`).Scan(&txids); err != nil {
			t.Fatal(err)
		}
		if txids != 1 {
			t.Errorf("the %d queued writes of distinct parts were stored by %d transactions, want 1", n-1, txids)
		}
		for i := 1; i < n; i++ {
			backendtest.WantPart(t, res, scope(i), "summary", "batched", "holder-a", 5)
		}
		backendtest.WantFloor(t, res, scope(1), 5)
		backendtest.WantFloor(t, res, scope(2), 6)
		if _, ok, err := res.ReadPart(ctx, scope(1), "stale"); err != nil || ok {
			t.Errorf("the stale write's part: stored %v, %v; want not stored", ok, err)
		}
		if _, ok, err := res.ReadPart(ctx, scope(3), "cancelled"); err != nil || ok {
			t.Errorf("the cancelled write's part: stored %v, %v; want not stored", ok, err)
		}
	})
}

// TestWriteBatchNotHeldByRaise: a scope whose floor is being raised by a
// long transaction (the install of a scope moved here, Install, which
// takes the floor row first and holds it until the copy commits) delays
// its own stale writer only. Queued behind two held writes, the stale write and writes of
// 30 other scopes go into one statement; the others are stored while the
// raise is still open, and the stale write waits for it and is rejected.
func TestWriteBatchNotHeldByRaise(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f, pool, res := newGatheringResource(t, driver, 8)
		// The raise stays open for as long as the test needs (the default
		// idle timeout would end it after 5s and let the writes through).
		fence := openFence(t, pool, fencepg.WithTimeouts(0, 10*time.Minute))
		ctx := context.Background()
		const n = 30
		scope := func(i int) string { return fmt.Sprintf("other-%02d", i) }
		for i := range n {
			backendtest.Write(t, res, scope(i), "summary", "seed", "holder-a", 5)
		}
		backendtest.Write(t, res, "raised", "summary", "seed", "holder-old", 5)

		entered, resume := make(chan struct{}), make(chan struct{})
		var resumeOnce sync.Once
		end := func() { resumeOnce.Do(func() { close(resume) }) }
		t.Cleanup(end) // a failed test still ends the raise, so its pool can close
		raise := make(chan error, 1)
		go func() {
			// The install's transaction: it raises the floor to 6 and keeps
			// the row locked until the transaction ends.
			s := leasecore.ScopeSeal{Scope: "raised", To: "db1", Floor: 6}
			var enterOnce sync.Once
			enter := func() { enterOnce.Do(func() { close(entered) }) }
			defer enter() // a failed install lets the test go on to its error
			var r leasecore.Result
			var err error
			if pool.Pgx != nil {
				err = pgx.BeginFunc(ctx, pool.Pgx, func(tx pgx.Tx) error {
					if r, err = fence.Pgx.Install(ctx, tx, s); err == nil {
						enter()
						<-resume
					}
					return err
				})
			} else {
				var tx *sql.Tx
				if tx, err = pool.SQL.BeginTx(ctx, nil); err == nil {
					if r, err = fence.SQL.Install(ctx, tx, s); err == nil {
						enter()
						<-resume
						err = tx.Commit()
					} else {
						_ = tx.Rollback()
					}
				}
			}
			if err == nil && !r.Accepted {
				err = fmt.Errorf("the raise was rejected: %+v", r)
			}
			raise <- err
		}()
		<-entered // the floor of "raised" is 6 and locked, uncommitted
		release := holdBothPlaces(t, f.resourceDB, res)
		stale := make(chan writeOutcome, 1)
		startWrite(ctx, res, "stale", leasecore.Write{Scope: "raised", Part: "summary", Content: "stale", Writer: "holder-old", Token: 5}, stale)
		out := make(chan writeOutcome, n)
		for i := range n {
			startWrite(ctx, res, scope(i), leasecore.Write{Scope: scope(i), Part: "summary", Content: "batched", Writer: "holder-a", Token: 5}, out)
		}
		wantNone(t, out, "while both statement places were held")
		release()
		timeout := time.After(20 * time.Second)
		for range n {
			select {
			case o := <-out:
				if o.err != nil {
					t.Fatalf("write %s: %v", o.name, o.err)
				}
				backendtest.WantResult(t, o.name, o.res, true, 5)
			case <-timeout:
				t.Fatal("the other scopes' writes did not finish within 20s while one scope's floor was being raised")
			}
		}
		wantNone(t, stale, "before the raise of its floor committed")
		end()
		if err := <-raise; err != nil {
			t.Fatal(err)
		}
		o := <-stale
		if o.err != nil {
			t.Fatal(o.err)
		}
		backendtest.WantResult(t, "stale", o.res, false, 6)
		backendtest.WantPart(t, res, "raised", "summary", "seed", "holder-old", 5)
	})
}

// TestWriteBatchConcurrentTokens races 48 writers of 8 scopes, each writer
// with one token of 1..6, through one Resource, while newer tokens keep
// raising the floors. Checked afterwards (I3): no write was accepted after
// a write of the same scope with a larger token had been accepted and had
// returned; every scope's floor is the largest token accepted in it; every
// part holds the content of the largest token accepted for it.
func TestWriteBatchConcurrentTokens(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		_, _, res := newGatheringResource(t, driver, 16)
		ctx := context.Background()
		const (
			scopes, tokens, perToken, writes = 8, 6, 1, 30
			parts                            = 3
		)
		type done struct {
			scope, part string
			token       leasecore.Token
			start, end  time.Time
			accepted    bool
		}
		var (
			mu   sync.Mutex
			log  []done
			wg   sync.WaitGroup
			errs = make(chan error, scopes*tokens*perToken)
		)
		for s := range scopes {
			for tok := 1; tok <= tokens; tok++ {
				for g := range perToken {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(s), uint64(tok*10+g)))
						for i := range writes {
							w := leasecore.Write{Scope: fmt.Sprintf("race-%d", s), Part: fmt.Sprintf("p%d", rng.IntN(parts)),
								Content: fmt.Sprintf("token %d write %d", tok, i), Writer: fmt.Sprintf("holder-%d", tok), Token: leasecore.Token(tok)}
							start := time.Now()
							r, err := res.Write(ctx, w)
							end := time.Now()
							if err != nil {
								errs <- err
								return
							}
							mu.Lock()
							log = append(log, done{w.Scope, w.Part, w.Token, start, end, r.Accepted})
							mu.Unlock()
							if !r.Accepted {
								return // a stale holder stops, as a real one would
							}
						}
					}()
				}
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		maxAccepted := map[string]leasecore.Token{}
		maxPart := map[[2]string]leasecore.Token{}
		for _, a := range log {
			if !a.accepted {
				continue
			}
			maxAccepted[a.scope] = max(maxAccepted[a.scope], a.token)
			k := [2]string{a.scope, a.part}
			maxPart[k] = max(maxPart[k], a.token)
			for _, b := range log {
				if b.accepted && b.scope == a.scope && b.token > a.token && b.end.Before(a.start) {
					t.Fatalf("I3: %s token %d accepted (started %s) after token %d was accepted (returned %s)",
						a.scope, a.token, a.start.Format(time.StampMicro), b.token, b.end.Format(time.StampMicro))
				}
			}
		}
		for s, tok := range maxAccepted {
			backendtest.WantFloor(t, res, s, tok)
		}
		for k, tok := range maxPart {
			p, ok, err := res.ReadPart(ctx, k[0], k[1])
			if err != nil || !ok || p.Token != tok {
				t.Errorf("%s/%s holds %+v (found %v, %v); want the content of token %d, the largest accepted for it", k[0], k[1], p, ok, err, tok)
			}
		}
		t.Logf("%d writes, %d scopes", len(log), len(maxAccepted))
	})
}

// TestWriteFastPathHoldsFloor: a fast-path write, alone or in a batch,
// holds its scope's floor row share-locked until it commits, so a newer
// token's write waits for it (I3: the data written under a token commits
// before the floor passes the token). Both are made to wait on a part row
// after taking that lock; a write of token 6 to each scope must wait until
// they commit, and the floor ends at 6 with token 5's parts stored.
func TestWriteFastPathHoldsFloor(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f, pool, res := newGatheringResource(t, driver, 8)
		// The newer writes go through a Resource that logs every attempt:
		// it runs the full check at once (an accepted entry is only written
		// there), so they wait on the floor, not for a statement place.
		full, err := pool.Resource(fencepg.WithAttemptLog(leasecore.LogAll))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		backendtest.Write(t, res, "batched", "q", "seed", "holder-old", 5)
		// A second transaction holds the batched write's part row.
		tx, err := f.resourceDB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, `SELECT FROM leasefence.report_part WHERE scope = 'batched' FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		release := holdBothPlaces(t, f.resourceDB, res) // two single statements hold "blocker"'s floor
		batched := make(chan writeOutcome, 1)
		startWrite(ctx, res, "batched", leasecore.Write{Scope: "batched", Part: "q", Content: "token 5", Writer: "holder-old", Token: 5}, batched)

		newer := make(chan writeOutcome, 2)
		startWrite(ctx, full, "newer blocker", leasecore.Write{Scope: "blocker", Part: "new", Content: "token 6", Writer: "holder-new", Token: 6}, newer)
		waitLockWaiters(t, f.resourceDB, 3) // the two held writes, and the newer write behind their floor locks
		wantNone(t, newer, "while two writes of token 5 held the floor")
		release() // the batch with "batched" starts, and waits on its part row
		o := <-newer
		if o.err != nil {
			t.Fatal(o.err)
		}
		backendtest.WantResult(t, o.name, o.res, true, 6)

		waitLockWaiters(t, f.resourceDB, 1) // the batch, behind the part row
		startWrite(ctx, full, "newer batched", leasecore.Write{Scope: "batched", Part: "new", Content: "token 6", Writer: "holder-new", Token: 6}, newer)
		waitLockWaiters(t, f.resourceDB, 2)
		wantNone(t, newer, "while a batch with a write of token 5 held the floor")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, ch := range []chan writeOutcome{batched, newer} {
			o := <-ch
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.name == "batched" {
				backendtest.WantResult(t, o.name, o.res, true, 5)
			} else {
				backendtest.WantResult(t, o.name, o.res, true, 6)
			}
		}
		for _, scope := range []string{"blocker", "batched"} {
			backendtest.WantFloor(t, res, scope, 6)
		}
		backendtest.WantPart(t, res, "blocker", "p1", "held", "holder-b", 5)
		backendtest.WantPart(t, res, "batched", "q", "token 5", "holder-old", 5)
	})
}
