package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestHolderSessionTokensAcrossCrash: with holder sessions, tokens per name
// strictly increase across session losses and across a server crash, and
// are never issued twice. On a cluster whose default is synchronous_commit
// = off (as TestDurableOnAsyncCommitCluster; its control shows that this
// cluster does lose acknowledged plain commits), holders acquire, release,
// and let their sessions expire and re-acquire (a new session each time),
// while rivals take the names of expired sessions (ending those sessions);
// the server is stopped immediately. After recovery every name's last
// token is at least the last one acknowledged, the next acquire issues a
// larger one, and a name held on a long session across the crash is still
// held and renews (the session row, its id and its expiry by the database
// clock came back from the WAL with the token).
func TestHolderSessionTokensAcrossCrash(t *testing.T) {
	cluster := pgtemp.StartTB(t, asyncCommitSettings...)
	ctx := t.Context()
	if err := cluster.CreateDatabase(ctx, "lease_sess_crash"); err != nil {
		t.Fatal(err)
	}
	for _, driver := range pgopen.Drivers {
		t.Run(driver, func(t *testing.T) {
			pool := pgtest.Open(t, driver, cluster.DSN("lease_sess_crash"), 8)
			store, err := pool.LeaseStore(fencepg.WithSharedLeases())
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := pgtest.DB(pool).Exec(ctx, pgsql.TruncateLease); err != nil {
				t.Fatal(err)
			}
			control := controlCounter(t, cluster.DSN("lease_sess_crash"), "sess_"+driver)
			kept, err := store.Acquire(ctx, "kept-across-crash", "holder-k", time.Minute)
			if err != nil {
				t.Fatal(err)
			}

			const workers = 4
			const short = 30 * time.Millisecond
			var mu sync.Mutex
			acked := map[string]leasecore.Token{} // the largest token acknowledged per name
			note := func(g leasecore.Grant) {
				mu.Lock()
				defer mu.Unlock()
				if g.Token <= acked[g.Name] {
					t.Errorf("%s: token %d acknowledged after token %d", g.Name, g.Token, acked[g.Name])
				}
				acked[g.Name] = g.Token
			}
			loadCtx, stopLoad := context.WithTimeout(ctx, 1200*time.Millisecond)
			var wg sync.WaitGroup
			for w := range workers {
				names := []string{fmt.Sprintf("job-%d-a", w), fmt.Sprintf("job-%d-b", w)}
				holder, rival := fmt.Sprintf("holder-%d", w), fmt.Sprintf("rival-%d", w)
				wg.Go(func() {
					for round := 0; loadCtx.Err() == nil; round++ {
						var gs []leasecore.Grant
						for _, n := range names {
							g, err := store.Acquire(loadCtx, n, holder, short)
							if err != nil {
								continue // held by the rival still, or the load ended
							}
							note(g)
							gs = append(gs, g)
						}
						if round%2 == 0 {
							for _, g := range gs {
								_ = store.Release(loadCtx, g)
							}
							continue
						}
						// Let the session expire; the rival takes one name of it,
						// which ends the session, and the holder the rest on a
						// new session in its next round.
						time.Sleep(short + 5*time.Millisecond)
						if g, err := store.Acquire(loadCtx, names[0], rival, short); err == nil {
							note(g)
						}
					}
				})
			}
			wg.Wait()
			stopLoad()
			controlAcked := control.bumpUnwritten(t)

			if _, err := cluster.RestartImmediate(ctx); err != nil {
				t.Fatal(err)
			}
			if got := control.read(t); got >= controlAcked {
				t.Fatalf("control: the counter is %d after the crash, %d increments were acknowledged: this cluster lost no asynchronous commit, so the test proves nothing", got, controlAcked)
			}
			if len(acked) < 2*workers {
				t.Fatalf("the load acquired %d names, want %d", len(acked), 2*workers)
			}
			for name, tok := range acked {
				var st leasecore.LeaseState
				if err := afterCrash(ctx, func() (err error) { st, err = store.Inspect(ctx, name); return err }); err != nil {
					t.Fatal(err)
				}
				if st.Token < tok {
					t.Errorf("%s: the last token is %d after the crash, but token %d was acknowledged before it: it would be issued twice", name, st.Token, tok)
				}
				// Wait out the short sessions, then acquire: a larger token.
				time.Sleep(short)
				var g leasecore.Grant
				err := afterCrash(ctx, func() (err error) { g, err = store.Acquire(ctx, name, "after-crash", time.Minute); return err })
				if err != nil {
					t.Fatalf("%s: acquire after the crash: %v", name, err)
				}
				if g.Token <= tok {
					t.Errorf("%s: token %d after the crash, %d was acknowledged before it", name, g.Token, tok)
				}
			}
			t.Logf("%d names, last acknowledged tokens %v", len(acked), acked)

			var st leasecore.LeaseState
			if err := afterCrash(ctx, func() (err error) { st, err = store.Inspect(ctx, kept.Name); return err }); err != nil {
				t.Fatal(err)
			}
			if !st.Held || st.Holder != "holder-k" || st.Token != kept.Token {
				t.Fatalf("the name held on a long session across the crash: %+v, want held by holder-k token %d", st, kept.Token)
			}
			if _, err := store.Renew(ctx, kept); err != nil {
				t.Fatalf("renew of the name held across the crash: %v", err)
			}
			if err := store.Release(ctx, kept); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestHolderSessionLostAcquireAnswer: an acquire whose answer is lost —
// the server carries it out and the client sees a broken connection — must
// not leave the name attached to the holder's session, where the holder's
// renewals of its other names would keep it held for ever with nobody
// knowing. Through pgconformance's answer-dropping proxy (the one X2 uses):
// with pgx the store sees a broken connection and undoes the acquire by its
// id; with lib/pq database/sql sends the acquire again on a new connection,
// which finds the name held by the first execution (pgstore.ErrResent) and
// undoes it. Either way the acquire fails with ErrUnavailable, the name is
// free at once (released, its token kept), and the holder's other name
// renews on.
func TestHolderSessionLostAcquireAnswer(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		h, amb, loseNextAnswer := ambiguousSessionHarness(t, driver, "lost")
		reader, err := h.OpenLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insp := reader.(leasecore.LeaseInspector)
		keep, err := amb.Acquire(ctx, "keep", "holder-g", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		loseNextAnswer()
		g, err := amb.Acquire(ctx, "ghost", "holder-g", 5*time.Second)
		if !errors.Is(err, leasecore.ErrUnavailable) {
			t.Fatalf("acquire whose answer was lost: %+v, %v; want an error wrapping ErrUnavailable", g, err)
		}
		if driver == pgopen.Libpq && !errors.Is(err, pgstore.ErrResent) {
			t.Errorf("lib/pq: %v, want the resent acquire found (pgstore.ErrResent)", err)
		}
		t.Logf("%s: %v", driver, err)
		st, err := insp.Inspect(ctx, "ghost")
		if err != nil {
			t.Fatal(err)
		}
		if st.Held || st.Token != 1 || !st.Released {
			t.Fatalf("ghost right after the lost acquire: %+v, want free (released, token 1: the acquire took effect and was undone)", st)
		}
		for range 3 {
			if keep, err = amb.Renew(ctx, keep); err != nil {
				t.Fatal(err)
			}
		}
		if st, err := insp.Inspect(ctx, "ghost"); err != nil || st.Held {
			t.Fatalf("ghost after holder-g's renewals of keep: %+v, %v", st, err)
		}
		if g, err := reader.Acquire(ctx, "ghost", "holder-b", time.Minute); err != nil || g.Token != 2 {
			t.Fatalf("holder-b's acquire of ghost: %+v, %v; want token 2", g, err)
		}
	})
}

// TestHolderSessionResentAcquire: the acquire statement run twice with one
// acquire id — what database/sql does after lib/pq reports a connection
// broken after sending — grants once; the second run finds the first's
// hold and says so (pgstore.ErrResent, wrapping ErrUnavailable) instead of
// ErrHeld, so that the store undoes it. Another acquire of the same holder
// (another id) gets ErrHeld.
func TestHolderSessionResentAcquire(t *testing.T) {
	f := newSessionFixture(t, pgopen.Pgx)
	ctx := t.Context()
	run := func(id int64) (leasecore.Grant, error) {
		return pgstore.AcquireSession(ctx, f.leaseDB, pgsql.AcquireSession, "test", "job", "holder-a", time.Minute, fencepg.MinTTL, id)
	}
	g, err := run(42)
	if err != nil || g.Token != 1 {
		t.Fatalf("first run: %+v, %v", g, err)
	}
	_, err = run(42)
	if !errors.Is(err, pgstore.ErrResent) || !errors.Is(err, leasecore.ErrUnavailable) || errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("second run with the same id: %v, want ErrResent", err)
	}
	_, err = run(43)
	if !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("run with another id: %v, want ErrHeld", err)
	}
	if got := f.state(t, "job"); got != "held by holder-a token=1" {
		t.Fatalf("after the runs: %s", got)
	}
}

// TestHolderSessionCrossAcquire: two holders whose sessions expired take
// each other's names at the same moment, over and over. Each acquire locks
// the name's row, then the other holder's session (to end it), then its
// own: the one order in which two acquires can deadlock. The server aborts
// one of a deadlock, which did nothing, and the store runs it again: every
// acquire succeeds, each with its name's next token.
func TestHolderSessionCrossAcquire(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newSessionFixture(t, driver)
		ctx := t.Context()
		pool := pgtest.Open(t, driver, f.leaseDSN, 16)
		store, err := pool.LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		const ttl = 40 * time.Millisecond
		const perHolder, rounds = 4, 12
		owner := map[string]string{}
		for _, h := range []string{"holder-a", "holder-b"} {
			for i := range perHolder {
				n := fmt.Sprintf("%s-name-%d", h, i)
				if _, err := store.Acquire(ctx, n, h, ttl); err != nil {
					t.Fatal(err)
				}
				owner[n] = h
			}
		}
		other := map[string]string{"holder-a": "holder-b", "holder-b": "holder-a"}
		for round := 2; round <= rounds+1; round++ {
			time.Sleep(ttl + 10*time.Millisecond) // every session has expired
			var wg sync.WaitGroup
			errs := make(chan error, len(owner))
			next := map[string]string{}
			for n, h := range owner {
				taker := other[h]
				next[n] = taker
				wg.Go(func() {
					g, err := store.Acquire(ctx, n, taker, ttl)
					switch {
					case err != nil:
						errs <- fmt.Errorf("round %d: %s takes %s: %w", round, taker, n, err)
					case g.Token != leasecore.Token(round):
						errs <- fmt.Errorf("round %d: %s takes %s with token %d, want %d", round, taker, n, g.Token, round)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			owner = next
		}
	})
}

// TestHolderSessionBadInput: with holder sessions, bad input to every
// lease entry point is rejected with a *leasecore.ArgError naming the field
// (or ctx's error) and nothing is written, holder_session included; grants
// that are not current (another holder's, expired with their session,
// released) fail with ErrLost and change nothing either.
func TestHolderSessionBadInput(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newSessionFixture(t, driver)
		ctx := t.Context()
		held, err := f.sess.Acquire(ctx, "held-lease", "holder-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		expired, err := f.sess.Acquire(ctx, "expired-lease", "holder-a", fencepg.MinTTL) // a session of its own: another TTL
		if err != nil {
			t.Fatal(err)
		}
		released, err := f.sess.Acquire(ctx, "released-lease", "holder-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.sess.Release(ctx, released); err != nil {
			t.Fatal(err)
		}
		waitExpired(t, f.fixture, expired.Name)
		snapshot := func() string {
			t.Helper()
			var s string
			if err := f.leaseDB.QueryRow(ctx, `SELECT
				(SELECT string_agg(l::text, E'\n' ORDER BY name) FROM leasefence.lease l) || E'\n' ||
				(SELECT string_agg(s::text, E'\n' ORDER BY holder, ttl_us) FROM leasefence.holder_session s)`).Scan(&s); err != nil {
				t.Fatal(err)
			}
			return s
		}
		before := snapshot()
		check := func(t *testing.T, c conformance.BadCall) {
			if err := c.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(); after != before {
				old := before
				before = after
				t.Fatalf("tables changed:\nbefore:\n%s\nafter:\n%s", old, after)
			}
		}
		calls := conformance.BadInputCalls(conformance.BadInput{Lease: f.sess, Grant: held, Free: "lease-new", MinTTL: fencepg.MinTTL})
		for _, c := range []struct {
			name, field string
			call        func(ctx context.Context) error
		}{
			{"take over empty name", "name", func(ctx context.Context) error {
				_, _, err := f.sess.TakeOver(ctx, "", "op", time.Minute)
				return err
			}},
			{"take over ttl below MinTTL", "ttl", func(ctx context.Context) error {
				_, _, err := f.sess.TakeOver(ctx, "held-lease", "op", time.Millisecond)
				return err
			}},
			{"list limit 0", "limit", func(ctx context.Context) error { _, err := f.sess.List(ctx, 0); return err }},
		} {
			calls = append(calls, conformance.BadCall{Name: c.name, Want: leasecore.ErrInvalidArgument, Mention: c.field, Call: c.call})
		}
		stranger := held
		stranger.Holder = "holder-x"
		otherTTL := held
		otherTTL.TTL = time.Minute
		lost := func(name, reason string, call func(ctx context.Context) error) conformance.BadCall {
			return conformance.BadCall{Name: name, Want: leasecore.ErrLost, Mention: reason, Call: call}
		}
		calls = append(calls,
			conformance.BadCall{Name: "acquire while held", Want: leasecore.ErrHeld, Mention: `held by "holder-a" with token 1`,
				Call: func(ctx context.Context) error {
					_, err := f.sess.Acquire(ctx, held.Name, "holder-b", time.Minute)
					return err
				}},
			conformance.BadCall{Name: "re-entrant acquire", Want: leasecore.ErrHeld, Mention: `held by "holder-a"`,
				Call: func(ctx context.Context) error {
					_, err := f.sess.Acquire(ctx, held.Name, "holder-a", time.Hour)
					return err
				}},
			lost("renew by non-holder", `holder "holder-x" does not hold it`,
				func(ctx context.Context) error { _, err := f.sess.Renew(ctx, stranger); return err }),
			lost("release by non-holder", `holder "holder-x" does not hold it`,
				func(ctx context.Context) error { return f.sess.Release(ctx, stranger) }),
			lost("renew with another ttl", "not on the one of the grant's ttl 1m0s",
				func(ctx context.Context) error { _, err := f.sess.Renew(ctx, otherTTL); return err }),
			lost("renew after the session expired", "holder session expired",
				func(ctx context.Context) error { _, err := f.sess.Renew(ctx, expired); return err }),
			lost("release after the session expired", "holder session expired",
				func(ctx context.Context) error { return f.sess.Release(ctx, expired) }),
			lost("release twice", "released", func(ctx context.Context) error { return f.sess.Release(ctx, released) }),
			lost("renew after release", "released",
				func(ctx context.Context) error { _, err := f.sess.Renew(ctx, released); return err }),
		)
		for _, c := range calls {
			t.Run(c.Name, func(t *testing.T) { check(t, c) })
		}
		renewAll := func(gs ...leasecore.Grant) ([]error, error) {
			_, lostErrs, err := f.sess.RenewAll(ctx, gs)
			return lostErrs, err
		}
		lostErrs, err := renewAll(held, expired, released)
		if err != nil {
			t.Fatal(err)
		}
		if lostErrs[0] != nil {
			t.Fatalf("RenewAll: the held grant was lost: %v", lostErrs[0])
		}
		wantLost(t, "RenewAll of a grant whose session expired", lostErrs[1], "holder session expired")
		wantLost(t, "RenewAll of a released grant", lostErrs[2], "released")
	})
}

// TestHolderSessionMixedModes: stores with and without holder sessions on
// one database never let two holders in at once. A name on a session
// reads as held to a store without the mode and its Renew and Release
// refuse it, naming the mode; the session store refuses a name held
// without a session the same way; a release makes the name free for both;
// TakeOver through either store ends only the name it takes, reporting the
// previous state by that name's own rule.
func TestHolderSessionMixedModes(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newSessionFixture(t, driver)
		ctx := t.Context()
		gs, err := f.sess.Acquire(ctx, "on-session", "holder-s", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		gp, err := f.leases.Acquire(ctx, "per-lease", "holder-p", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.leases.Acquire(ctx, "on-session", "holder-p", time.Minute); !errors.Is(err, leasecore.ErrHeld) {
			t.Fatalf("per-lease acquire of a name on a session: %v, want ErrHeld", err)
		}
		if _, err := f.sess.Acquire(ctx, "per-lease", "holder-s", time.Minute); !errors.Is(err, leasecore.ErrHeld) {
			t.Fatalf("session acquire of a name held without one: %v, want ErrHeld", err)
		}
		_, err = f.leases.Renew(ctx, gs)
		wantLost(t, "per-lease renew of a session grant", err, "WithSharedLeases")
		wantLost(t, "per-lease release of a session grant", f.leases.Release(ctx, gs), "WithSharedLeases")
		_, lostErrs, err := f.leases.RenewAll(ctx, []leasecore.Grant{gs})
		if err != nil {
			t.Fatal(err)
		}
		wantLost(t, "per-lease RenewAll of a session grant", lostErrs[0], "WithSharedLeases")
		_, err = f.sess.Renew(ctx, gp)
		wantLost(t, "session renew of a per-lease grant", err, "held without a holder session")
		wantLost(t, "session release of a per-lease grant", f.sess.Release(ctx, gp), "held without a holder session")
		if got := f.state(t, "on-session") + "; " + f.state(t, "per-lease"); got != "held by holder-s token=1; held by holder-p token=1" {
			t.Fatalf("after the refusals: %s", got)
		}

		// A session name released is free for a store without the mode.
		if err := f.sess.Release(ctx, gs); err != nil {
			t.Fatal(err)
		}
		if g, err := f.leases.Acquire(ctx, "on-session", "holder-p", time.Minute); err != nil || g.Token != 2 {
			t.Fatalf("per-lease acquire after the session release: %+v, %v", g, err)
		}

		// TakeOver through the store without the mode of a name on a session:
		// that name only; the session's other name stays held.
		g1, err := f.sess.Acquire(ctx, "s-1", "holder-s", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.sess.Acquire(ctx, "s-2", "holder-s", time.Minute); err != nil {
			t.Fatal(err)
		}
		taken, prev, err := f.leases.TakeOver(ctx, "s-1", "operator", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if taken.Token != 2 || !prev.Held || prev.Holder != "holder-s" || prev.Token != 1 || prev.Remaining <= 0 {
			t.Fatalf("take over of s-1: %+v, previous %+v", taken, prev)
		}
		if got := f.state(t, "s-1") + "; " + f.state(t, "s-2"); got != "held by operator token=2; held by holder-s token=1" {
			t.Fatalf("after the take-over: %s", got)
		}
		_, err = f.sess.Renew(ctx, g1)
		wantLost(t, "renew of the name taken over", err, "superseded by token 2")
		if err := f.leases.Release(ctx, taken); err != nil {
			t.Fatal(err)
		}
		// TakeOver through the session store: the name joins the taker's
		// session and renews and releases through that store.
		taken, prev, err = f.sess.TakeOver(ctx, "s-2", "operator", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if taken.Token != 2 || !prev.Held || prev.Holder != "holder-s" {
			t.Fatalf("session take over of s-2: %+v, previous %+v", taken, prev)
		}
		if _, err := f.sess.Renew(ctx, taken); err != nil {
			t.Fatal(err)
		}
		if err := f.sess.Release(ctx, taken); err != nil {
			t.Fatal(err)
		}
		if got := f.state(t, "s-2"); got != "free token=2 released=true" {
			t.Fatalf("s-2 after its release: %s", got)
		}
	})
}

// TestHolderSessionRuntimeRole: a store without holder sessions reads
// names on sessions (Inspect, List) with the grants on lease only, through
// holder_session_expiry; a store with them needs the grants on
// holder_session too, and Preflight and the first acquire name the grant.
func TestHolderSessionRuntimeRole(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newSessionFixture(t, driver)
		ctx := t.Context()
		if _, err := f.sess.Acquire(ctx, "on-session", "holder-s", time.Minute); err != nil {
			t.Fatal(err)
		}
		leaseOnly, both := "lf_sess_lease_"+driver, "lf_sess_both_"+driver
		createRole(t, f.leaseDB, leaseOnly, runtimeGrants)
		createRole(t, f.leaseDB, both, runtimeGrants+`
			GRANT SELECT, INSERT, UPDATE ON leasefence.holder_session TO %[1]s;`)
		open := func(role string, opts ...fencepg.Option) *fencepg.LeaseStore {
			t.Helper()
			s, err := pgtest.Open(t, driver, withUser(t, f.leaseDSN, role, "", ""), 2).LeaseStore(opts...)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}

		plain := open(leaseOnly)
		if err := plain.Preflight(ctx); err != nil {
			t.Fatalf("store without the mode, lease grants only: %v", err)
		}
		st, err := plain.Inspect(ctx, "on-session")
		if err != nil || !st.Held || st.Holder != "holder-s" || st.Remaining <= 0 {
			t.Fatalf("inspect of a name on a session with the grants on lease only: %+v, %v", st, err)
		}
		if list, err := plain.List(ctx, 10); err != nil || len(list) != 1 || !list[0].Held {
			t.Fatalf("list with the grants on lease only: %+v, %v", list, err)
		}

		sess := open(leaseOnly, fencepg.WithSharedLeases())
		err = sess.Preflight(ctx)
		wantErr(t, err, leasecore.ErrConfig, "GRANT SELECT, INSERT, UPDATE ON leasefence.holder_session TO "+leaseOnly)
		_, err = sess.Acquire(ctx, "job", "holder-r", time.Minute)
		wantErr(t, err, leasecore.ErrConfig, "GRANT SELECT, INSERT, UPDATE ON leasefence.holder_session TO this role")

		sess = open(both, fencepg.WithSharedLeases())
		if err := sess.Preflight(ctx); err != nil {
			t.Fatal(err)
		}
		g, err := sess.Acquire(ctx, "job", "holder-r", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if g, err = sess.Renew(ctx, g); err != nil {
			t.Fatal(err)
		}
		if _, _, err := sess.RenewAll(ctx, []leasecore.Grant{g}); err != nil {
			t.Fatal(err)
		}
		if err := sess.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	})
}

// TestHolderSessionCheckSchema: a lease schema made before holder sessions
// (no holder_session table, no session columns, no holder_session_expiry)
// is out of date for both modes, and Migrate brings it up to date without
// touching its rows: an old name keeps its token and is held as before.
func TestHolderSessionCheckSchema(t *testing.T) {
	p := pgtest.Open(t, pgopen.Pgx, pgtest.CreateDB(t, "sess_upgrade"), 2)
	ctx := t.Context()
	plain, err := p.LeaseStore()
	if err != nil {
		t.Fatal(err)
	}
	sess, err := p.LeaseStore(fencepg.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := plain.Acquire(ctx, "old-job", "holder-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	downgrade := func(db dbx.DB) {
		t.Helper()
		if _, err := db.Exec(ctx, `DROP TRIGGER lease_detached_from_session ON leasefence.lease; DROP FUNCTION leasefence.note_session_detach();
			DROP FUNCTION leasefence.holder_session_expiry(text, uuid); DROP TABLE leasefence.holder_session;
			ALTER TABLE leasefence.lease DROP COLUMN session_id, DROP COLUMN acquire_id`); err != nil {
			t.Fatal(err)
		}
	}
	downgrade(pgtest.DB(p))
	wantErr(t, plain.CheckSchema(ctx), leasecore.ErrSchema, "leasefence.lease has no column session_id", "run Migrate")
	wantErr(t, sess.CheckSchema(ctx), leasecore.ErrSchema, "leasefence.lease has no column session_id", "run Migrate")
	if err := sess.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := plain.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := sess.Inspect(ctx, "old-job")
	if err != nil || !st.Held || st.Token != g.Token {
		t.Fatalf("the old name after the upgrade: %+v, %v", st, err)
	}
	if _, err := plain.Renew(ctx, g); err != nil {
		t.Fatal(err)
	}
	// Without the function alone: out of date too.
	if _, err := pgtest.DB(p).Exec(ctx, `DROP FUNCTION leasefence.holder_session_expiry(text, uuid)`); err != nil {
		t.Fatal(err)
	}
	wantErr(t, plain.CheckSchema(ctx), leasecore.ErrSchema, "function leasefence.holder_session_expiry is missing")
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sess.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	// A schema of holder sessions made before generations (no column, no
	// trigger): out of date for the mode only; Migrate adds both.
	if _, err := pgtest.DB(p).Exec(ctx, `DROP TRIGGER lease_detached_from_session ON leasefence.lease;
		ALTER TABLE leasefence.holder_session DROP COLUMN generation`); err != nil {
		t.Fatal(err)
	}
	wantErr(t, sess.CheckSchema(ctx), leasecore.ErrSchema, "leasefence.holder_session has no column generation", "run Migrate")
	if err := plain.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sess.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
}

// cutProxy forwards TCP connections to target on 127.0.0.1 until cut is
// called. Cut, it closes the client's side of a connection as soon as the
// server answers on it (the answer is dropped: the statement was carried
// out, and committed, the server sending nothing before its commit for a
// statement in autocommit), and it closes every new connection at once,
// until heal.
type cutProxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	cut      bool
	wg       sync.WaitGroup
	accepted []net.Conn
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.accepted {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
}

func (p *cutProxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.isCut() {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.accepted = append(p.accepted, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(s, c); s.Close() })
		p.wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && p.isCut() {
					c.Close() // the answer is dropped
					s.Close()
					return
				}
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					c.Close()
					return
				}
			}
		})
	}
}

// TestHolderSessionUndoRetried: when the undo of an acquire whose answer
// was lost cannot run at once (the server is unreachable right after), the
// store keeps it and runs it before the holder's next renewal through the
// store, which would otherwise extend the session the unknown hold hangs
// on: after that renewal the name is free.
func TestHolderSessionUndoRetried(t *testing.T) {
	f := newSessionFixture(t, pgopen.Pgx)
	ctx := t.Context()
	u, err := url.Parse(f.leaseDSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCutProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	store, err := pgtest.Open(t, pgopen.Pgx, u.String(), 1).LeaseStore(fencepg.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	keep, err := store.Acquire(ctx, "keep", "holder-g", 10*time.Second) // also prepares the statement
	if err != nil {
		t.Fatal(err)
	}
	proxy.setCut(true)
	_, err = store.Acquire(ctx, "ghost", "holder-g", 10*time.Second)
	if !errors.Is(err, leasecore.ErrUnavailable) {
		t.Fatalf("acquire whose answer was dropped: %v, want ErrUnavailable", err)
	}
	if got := f.state(t, "ghost"); got != "held by holder-g token=1" {
		t.Fatalf("ghost while the server is unreachable: %s, want held (the acquire took effect, the undo could not run yet)", got)
	}
	proxy.setCut(false)
	var renewed leasecore.Grant
	if err := afterCrash(ctx, func() (err error) { renewed, err = store.Renew(ctx, keep); return err }); err != nil {
		t.Fatal(err)
	}
	if got := f.state(t, "ghost"); got != "free token=1 released=true" {
		t.Fatalf("ghost after holder-g's next renewal: %s, want free (the pending undo ran first)", got)
	}
	if got := f.state(t, "keep"); got != "held by holder-g token=1" {
		t.Fatalf("keep: %s", got)
	}
	if err := store.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
}

// ambiguousSessionHarness opens a pgconformance harness with holder
// sessions on fresh databases named after prefix (closed at the test's
// end), and its lease store whose next answer loseNextAnswer loses.
func ambiguousSessionHarness(t *testing.T, driver, prefix string) (h conformance.Harness, amb leasecore.Lease, loseNextAnswer func()) {
	t.Helper()
	ctx := t.Context()
	h, err := pgconformance.New(pgconformance.Config{Driver: driver, LeaseDSN: pgtest.CreateDB(t, "lease_"+prefix),
		ResourceDSN: pgtest.CreateDB(t, "res_"+prefix), SharedLeases: true})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	amb, loseNextAnswer, err = h.(conformance.AmbiguousOutcomes).AmbiguousLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h, amb, loseNextAnswer
}
