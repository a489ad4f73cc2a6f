package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// sessionFixture is a fixture plus a lease store with holder sessions on
// the same lease database (f.leases has no holder sessions).
type sessionFixture struct {
	*fixture
	sess *fencepg.LeaseStore
}

func newSessionFixture(t *testing.T, driver string) sessionFixture {
	t.Helper()
	f := newFixture(t, driver)
	sess, err := f.leasePool.LeaseStore(fencepg.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	if !sess.Shared() || f.leases.Shared() {
		t.Fatalf("Shared(): with the option %t, without %t", sess.Shared(), f.leases.Shared())
	}
	if err := sess.CheckSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	return sessionFixture{f, sess}
}

// sessionOf returns holder's session rows as "ttl=<ttl> id=<session id>
// live=<bool>", one per TTL.
func (f sessionFixture) sessionOf(t *testing.T, holder string) string {
	t.Helper()
	var s string
	err := f.leaseDB.QueryRow(t.Context(), `SELECT coalesce(string_agg(format('ttl=%s id=%s live=%s', ttl_us, session_id, (expires_at > now())::text), '; ' ORDER BY ttl_us), '')
		FROM leasefence.holder_session WHERE holder = $1`, holder).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// state renders what Inspect says of name, through the store without the
// mode (any store must read names of either mode).
func (f sessionFixture) state(t *testing.T, name string) string {
	t.Helper()
	st, err := f.leases.Inspect(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held {
		return fmt.Sprintf("free token=%d released=%t", st.Token, st.Released)
	}
	return fmt.Sprintf("held by %s token=%d", st.Holder, st.Token)
}

// wantLost checks that err is a *leasecore.HoldError wrapping ErrLost whose
// message says each of words.
func wantLost(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	var he *leasecore.HoldError
	if !errors.As(err, &he) || !errors.Is(err, leasecore.ErrLost) {
		t.Fatalf("%s: %v, want a *leasecore.HoldError wrapping ErrLost", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q does not say %q", what, err, w)
		}
	}
}

// TestHolderSessionLifecycle: a holder's names hang on one session row;
// each has its own token, +1 per grant; the holder's own live name and
// another holder's are refused; releasing one name ends only that name;
// when the session expires every name on it ends, renew fails with the
// cause, the holder's next acquire starts a new session, and the names of
// the old one stay free (no session comes back to life); another holder
// takes them with the next token.
func TestHolderSessionLifecycle(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newSessionFixture(t, driver)
		ctx := t.Context()
		const ttl = time.Second
		names := []string{"shard-1", "shard-2", "shard-3"}
		grants := map[string]leasecore.Grant{}
		for _, n := range names {
			start := time.Now()
			g, err := f.sess.Acquire(ctx, n, "holder-a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			if g.Token != 1 || g.TTL != ttl || g.Holder != "holder-a" || !strings.HasPrefix(g.Space, "postgres:") ||
				g.Start.Before(start) || g.Start.After(time.Now()) {
				t.Fatalf("grant of %s: %+v (call started at %v)", n, g, start)
			}
			grants[n] = g
			if got := f.state(t, n); got != "held by holder-a token=1" {
				t.Fatalf("%s after acquire: %s", n, got)
			}
		}
		first := f.sessionOf(t, "holder-a")
		if strings.Count(first, "ttl=") != 1 || !strings.Contains(first, "live=true") {
			t.Fatalf("holder-a's sessions after three acquires: %q, want one live session", first)
		}

		// Refused: the holder's own live name, through either store, and
		// another holder's acquire; nothing changes.
		for _, c := range []struct {
			store  *fencepg.LeaseStore
			holder string
		}{{f.sess, "holder-a"}, {f.sess, "holder-b"}, {f.leases, "holder-b"}} {
			_, err := c.store.Acquire(ctx, "shard-1", c.holder, ttl)
			if !errors.Is(err, leasecore.ErrHeld) {
				t.Fatalf("acquire of held shard-1 by %s (holder sessions %t): %v, want ErrHeld", c.holder, c.store.Shared(), err)
			}
		}
		if got := f.state(t, "shard-1"); got != "held by holder-a token=1" {
			t.Fatalf("shard-1 after refused acquires: %s", got)
		}

		// Release ends one name; the session and the others live on.
		if err := f.sess.Release(ctx, grants["shard-2"]); err != nil {
			t.Fatal(err)
		}
		if got := f.state(t, "shard-2"); got != "free token=1 released=true" {
			t.Fatalf("shard-2 after its release: %s", got)
		}
		for _, n := range []string{"shard-1", "shard-3"} {
			if got := f.state(t, n); got != "held by holder-a token=1" {
				t.Fatalf("%s after shard-2's release: %s", n, got)
			}
		}
		_, err := f.sess.Renew(ctx, grants["shard-2"])
		wantLost(t, "renew of the released shard-2", err, "released")
		wantLost(t, "release of the released shard-2", f.sess.Release(ctx, grants["shard-2"]), "released")
		g1, err := f.sess.Renew(ctx, grants["shard-1"])
		if err != nil {
			t.Fatalf("renew of shard-1 after shard-2's release: %v", err)
		}
		if g1.Token != 1 || !g1.Start.After(grants["shard-1"].Start) {
			t.Fatalf("renewed grant %+v, acquired %+v", g1, grants["shard-1"])
		}
		if got := f.sessionOf(t, "holder-a"); got != first {
			t.Fatalf("a renewal changed the session: %q, was %q", got, first)
		}

		// The holder stops renewing: every name on the session ends at once.
		waitExpired(t, f.fixture, "shard-1")
		if got := f.state(t, "shard-3"); got != "free token=1 released=false" {
			t.Fatalf("shard-3 once the session expired: %s", got)
		}
		_, err = f.sess.Renew(ctx, g1)
		wantLost(t, "renew after the session expired", err, "holder session expired", `holder "holder-a"`, "every name on it ended")
		_, _, err = f.sess.RenewAll(ctx, []leasecore.Grant{g1, grants["shard-3"]})
		if err != nil {
			t.Fatal(err)
		}
		wantLost(t, "release after the session expired", f.sess.Release(ctx, grants["shard-3"]), "holder session expired")

		// The holder acquires again: a new session; shard-3, on the old one,
		// stays free.
		g1b, err := f.sess.Acquire(ctx, "shard-1", "holder-a", ttl)
		if err != nil || g1b.Token != 2 {
			t.Fatalf("re-acquire of shard-1: %+v, %v; want token 2", g1b, err)
		}
		second := f.sessionOf(t, "holder-a")
		if second == first || !strings.Contains(second, "live=true") {
			t.Fatalf("holder-a's session after acquiring again: %q, was %q: want a new live session", second, first)
		}
		if got := f.state(t, "shard-3"); got != "free token=1 released=false" {
			t.Fatalf("shard-3, on the expired session, after holder-a acquired again: %s (a session came back to life)", got)
		}
		_, err = f.sess.Renew(ctx, grants["shard-3"])
		wantLost(t, "renew of shard-3 from the old session", err, "holder session is gone")

		// Another holder takes shard-3 with the next token, through either
		// store.
		g3, err := f.sess.Acquire(ctx, "shard-3", "holder-b", ttl)
		if err != nil || g3.Token != 2 {
			t.Fatalf("holder-b's acquire of shard-3: %+v, %v; want token 2", g3, err)
		}
		if err := f.sess.Release(ctx, g3); err != nil {
			t.Fatal(err)
		}
		g3, err = f.leases.Acquire(ctx, "shard-3", "holder-c", ttl)
		if err != nil || g3.Token != 3 {
			t.Fatalf("holder-c's acquire of shard-3 without holder sessions: %+v, %v; want token 3", g3, err)
		}

		// List reports names of both modes by their own rule.
		list, err := f.leases.List(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, st := range list {
			got = append(got, fmt.Sprintf("%s:%s/%d/held=%t/released=%t/remaining>0=%t", st.Name, st.Holder, st.Token, st.Held, st.Released, st.Remaining > 0))
		}
		want := []string{
			"shard-1:holder-a/2/held=true/released=false/remaining>0=true",
			"shard-2:holder-a/1/held=false/released=true/remaining>0=false",
			"shard-3:holder-c/3/held=true/released=false/remaining>0=true",
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("List:\n got %v\nwant %v", got, want)
		}
	})
}

// TestHolderSessionTTLs: a holder's names of two TTLs hang on two sessions
// and lapse independently, and a grant presented with another TTL than
// its session's is refused (the session is found by holder and TTL).
func TestHolderSessionTTLs(t *testing.T) {
	f := newSessionFixture(t, pgopen.Pgx)
	ctx := t.Context()
	long, err := f.sess.Acquire(ctx, "long", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.Acquire(ctx, "short", "holder-a", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(f.sessionOf(t, "holder-a"), "ttl="); got != 2 {
		t.Fatalf("holder-a has %d sessions, want 2 (one per TTL)", got)
	}
	waitExpired(t, f.fixture, "short")
	if got := f.state(t, "long"); got != "held by holder-a token=1" {
		t.Fatalf("long after short's session expired: %s", got)
	}
	other := long
	other.TTL = 200 * time.Millisecond
	_, err = f.sess.Renew(ctx, other)
	wantLost(t, "renew with the other session's TTL", err)
	other.TTL = 30 * time.Second
	_, err = f.sess.Renew(ctx, other)
	wantLost(t, "renew with a TTL of no session", err)
	if _, err := f.sess.Renew(ctx, long); err != nil {
		t.Fatal(err)
	}
}

// TestHolderSessionRenewWritesOneRow: RenewAll of a holder's 100 names
// updates one row, the holder's session, and no lease row: the lease rows
// keep their row versions (xmin), the server's statistics count one
// update of holder_session and none of lease. Renew of one name does the
// same and renews all 100.
func TestHolderSessionRenewWritesOneRow(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := t.Context()
		// One connection: the statistics of the store's statements are
		// that backend's, flushed on request (pg_stat_force_next_flush).
		pool := pgtest.Open(t, driver, f.leaseDSN, 1)
		store, err := pool.LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		const n = 100
		gs := make([]leasecore.Grant, n)
		for i := range gs {
			if gs[i], err = store.Acquire(ctx, fmt.Sprintf("shard-%03d", i), "holder-a", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		stats := func() (leaseUpd, sessionUpd int64) {
			t.Helper()
			if _, err := pgtest.DB(pool).Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				t.Fatal(err)
			}
			read := func() (int64, int64) {
				var l, s int64
				if err := f.leaseDB.QueryRow(ctx, `SELECT
					(SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'leasefence' AND relname = 'lease'),
					(SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'leasefence' AND relname = 'holder_session')`).Scan(&l, &s); err != nil {
					t.Fatal(err)
				}
				return l, s
			}
			// The flush happens when the store's backend next goes idle,
			// right after the statement above; wait for the counters to
			// stop moving.
			l, s := read()
			for range 50 {
				time.Sleep(20 * time.Millisecond)
				l2, s2 := read()
				if l2 == l && s2 == s {
					break
				}
				l, s = l2, s2
			}
			return l, s
		}
		versions := func() string {
			t.Helper()
			var v string
			if err := f.leaseDB.QueryRow(ctx, `SELECT string_agg(name || ':' || xmin::text, ',' ORDER BY name) FROM leasefence.lease`).Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}
		leaseBefore, sessionBefore := stats()
		rowsBefore, sessionRow := versions(), f.rowVersion(t, "holder-a")

		renewed, lost, err := store.RenewAll(ctx, gs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range gs {
			if lost[i] != nil || renewed[i].Token != gs[i].Token {
				t.Fatalf("grant %d: renewed %+v, lost %v", i, renewed[i], lost[i])
			}
		}
		if got := versions(); got != rowsBefore {
			t.Fatal("RenewAll rewrote lease rows")
		}
		if f.rowVersion(t, "holder-a") == sessionRow {
			t.Fatal("RenewAll did not update the session row")
		}
		leaseAfter, sessionAfter := stats()
		t.Logf("RenewAll of %d names: n_tup_upd lease %d -> %d, holder_session %d -> %d", n, leaseBefore, leaseAfter, sessionBefore, sessionAfter)
		if leaseAfter != leaseBefore || sessionAfter != sessionBefore+1 {
			t.Fatalf("RenewAll of %d names updated %d lease rows and %d session rows, want 0 and 1",
				n, leaseAfter-leaseBefore, sessionAfter-sessionBefore)
		}

		// Renew of one name: one update too, and every name is renewed (the
		// session's expiry, which Inspect reports for each, moves on).
		expiry := func() string {
			t.Helper()
			var e string
			if err := f.leaseDB.QueryRow(ctx, `SELECT expires_at::text FROM leasefence.holder_session WHERE holder = 'holder-a'`).Scan(&e); err != nil {
				t.Fatal(err)
			}
			return e
		}
		expiryBefore := expiry()
		if _, err := store.Renew(ctx, gs[0]); err != nil {
			t.Fatal(err)
		}
		if expiryAfter := expiry(); expiryAfter <= expiryBefore {
			t.Fatalf("renewing %s left the session's expiry at %s (was %s)", gs[0].Name, expiryAfter, expiryBefore)
		}
		leaseAfter2, sessionAfter2 := stats()
		if leaseAfter2 != leaseAfter || sessionAfter2 != sessionAfter+1 {
			t.Fatalf("Renew updated %d lease rows and %d session rows, want 0 and 1", leaseAfter2-leaseAfter, sessionAfter2-sessionAfter)
		}
	})
}

// rowVersion is the xmin of holder's session rows.
func (f *fixture) rowVersion(t *testing.T, holder string) string {
	t.Helper()
	var v string
	if err := f.leaseDB.QueryRow(t.Context(), `SELECT coalesce(string_agg(xmin::text, ','), '') FROM leasefence.holder_session WHERE holder = $1`, holder).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// endSession ends holder's sessions on the server as another holder's
// acquire does when it takes a name of an expired session
// (expires_at = '-infinity'): what a holder whose renewals stopped (a
// pause, a partition) finds when they resume.
func endSession(t *testing.T, db dbx.DB, holder string) {
	t.Helper()
	if _, err := db.Exec(t.Context(), `UPDATE leasefence.holder_session SET expires_at = '-infinity' WHERE holder = $1`, holder); err != nil {
		t.Fatal(err)
	}
}

// TestHolderSessionLossSeenBySessions: when a holder's session ends on the
// server, every leasecore.Session and every leasecore.SessionSet of that
// holder and TTL learns it at its next renewal: each Session ends with an
// error wrapping ErrLost (Err and Context's cause) and the SessionSet
// reports every name on Lost with such an error, each saying that the
// holder session expired and every name on it ended.
func TestHolderSessionLossSeenBySessions(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newSessionFixture(t, driver)
		ctx := t.Context()
		opts := []leasecore.SessionOption{leasecore.WithTTL(2 * time.Second), leasecore.WithRenewInterval(50 * time.Millisecond)}
		var sessions []*leasecore.Session
		for _, n := range []string{"job-1", "job-2"} {
			s, err := leasecore.NewSession(ctx, f.sess, n, "holder-a", opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.WithoutCancel(ctx))
			sessions = append(sessions, s)
		}
		set, err := leasecore.NewSessionSet(f.sess, "holder-a", opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer set.Close(context.WithoutCancel(ctx))
		shards := []string{"shard-1", "shard-2", "shard-3"}
		for _, n := range shards {
			if _, err := set.Acquire(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Count(f.sessionOf(t, "holder-a"), "ttl="); got != 1 {
			t.Fatalf("holder-a has %d session rows, want 1 for 2 sessions and a set of 3 names", got)
		}
		// Renewals keep everything alive for a while.
		time.Sleep(200 * time.Millisecond)
		for _, s := range sessions {
			if s.Err() != nil {
				t.Fatalf("session %s ended while renewed: %v", s.Grant().Name, s.Err())
			}
		}

		endSession(t, f.leaseDB, "holder-a")

		for _, s := range sessions {
			select {
			case <-s.Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("session %s did not end after its holder session ended", s.Grant().Name)
			}
			wantLost(t, "Session.Err of "+s.Grant().Name, s.Err(), "holder session expired", "every name on it ended")
			wantLost(t, "Session.Context cause of "+s.Grant().Name, context.Cause(s.Context()), "holder session expired")
		}
		lost := map[string]error{}
		timeout := time.After(5 * time.Second)
		for len(lost) < len(shards) {
			select {
			case ln := <-set.Lost():
				lost[ln.Name] = ln.Err
			case <-timeout:
				t.Fatalf("the set reported %d of %d names lost: %v", len(lost), len(shards), lost)
			}
		}
		for _, n := range shards {
			wantLost(t, "SessionSet's LostName of "+n, lost[n], "holder session expired", "every name on it ended")
			if set.Valid(n) {
				t.Fatalf("the set still holds %s", n)
			}
		}
		// Nobody holds them any more: another holder takes one with the
		// next token.
		if g, err := f.sess.Acquire(ctx, "shard-1", "holder-b", time.Minute); err != nil || g.Token != 2 {
			t.Fatalf("holder-b's acquire of shard-1: %+v, %v", g, err)
		}
	})
}
