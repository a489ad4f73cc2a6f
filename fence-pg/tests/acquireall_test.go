package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// forEachMode runs f per driver and per mode: the store without holder
// sessions (f.leases) and the one with (sess).
func forEachMode(t *testing.T, f func(t *testing.T, sf sessionFixture, store *fencepg.LeaseStore)) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		for _, sessions := range []bool{false, true} {
			t.Run(fmt.Sprintf("sessions=%t", sessions), func(t *testing.T) {
				sf := newSessionFixture(t, driver)
				store := sf.leases
				if sessions {
					store = sf.sess
				}
				f(t, sf, store)
			})
		}
	})
}

func batchNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return names
}

// xmins returns the distinct transaction ids that wrote the lease rows of
// names.
func (f *fixture) xmins(t *testing.T, names []string) []string {
	t.Helper()
	rows, err := f.leaseDB.Query(t.Context(),
		`SELECT DISTINCT xmin::text FROM leasefence.lease WHERE name IN (SELECT json_array_elements_text($1::json))`,
		`["`+strings.Join(names, `","`)+`"]`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var xs []string
	for rows.Next() {
		var x string
		if err := rows.Scan(&x); err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return xs
}

// sameGrant compares g with the grant Acquire gave for another name: every
// field but Name and Start.
func sameGrant(t *testing.T, what string, g, want leasecore.Grant) {
	t.Helper()
	g.Name, g.Start, want.Name, want.Start = "", time.Time{}, "", time.Time{}
	if g != want {
		t.Fatalf("%s: %+v, want %+v as Acquire gives (apart from Name and Start)", what, g, want)
	}
}

// TestAcquireAllNewNames: a batch of names that were never acquired is
// granted whole by one statement — every row written by one transaction,
// with token 1 — and each grant is what Acquire gives for a new name, its
// Start read before the call. With holder sessions every name hangs on the
// holder's one session under one acquire id, and a Renew of one name
// renews them all.
func TestAcquireAllNewNames(t *testing.T) {
	forEachMode(t, func(t *testing.T, f sessionFixture, store *fencepg.LeaseStore) {
		ctx := t.Context()
		ttl := time.Minute
		if store.Shared() {
			ttl = 2 * time.Second
		}
		single, err := store.Acquire(ctx, "single", "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		names := batchNames("shard", 100)
		before := time.Now()
		gs, errs, err := store.AcquireAll(ctx, names, "holder-a", ttl)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range gs {
			if errs[i] != nil {
				t.Fatalf("%s: %v", names[i], errs[i])
			}
			if g.Name != names[i] || g.Token != 1 {
				t.Fatalf("grant %d: %+v, want %s with token 1", i, g, names[i])
			}
			sameGrant(t, names[i], g, single)
			if g.Start.Before(before) || g.Start.After(after) || !g.Start.Equal(gs[0].Start) {
				t.Fatalf("%s: Start %v, want one reading within the call [%v, %v]", names[i], g.Start, before, after)
			}
		}
		if xs := f.xmins(t, names); len(xs) != 1 {
			t.Fatalf("the batch's rows were written by transactions %v, want one", xs)
		}
		for _, n := range []string{names[0], names[99]} {
			if got := f.state(t, n); got != "held by holder-a token=1" {
				t.Fatalf("%s: %s", n, got)
			}
		}
		if !store.Shared() {
			return
		}

		var sessions, acquireIDs, singleSession int
		if err := f.leaseDB.QueryRow(ctx, `SELECT count(DISTINCT session_id), count(DISTINCT acquire_id),
			       count(*) FILTER (WHERE session_id = (SELECT session_id FROM leasefence.lease WHERE name = 'single'))
			  FROM leasefence.lease WHERE name LIKE 'shard-%'`).Scan(&sessions, &acquireIDs, &singleSession); err != nil {
			t.Fatal(err)
		}
		if sessions != 1 || acquireIDs != 1 || singleSession != 100 {
			t.Fatalf("the batch's rows hang on %d sessions with %d acquire ids, %d on the session of the single acquire; want 1, 1, 100",
				sessions, acquireIDs, singleSession)
		}
		if s := f.sessionOf(t, "holder-a"); strings.Count(s, "ttl=") != 1 {
			t.Fatalf("holder-a's sessions: %q, want one", s)
		}
		// Renewing one name for 1.5 TTLs keeps all of them held.
		g := gs[0]
		for end := time.Now().Add(3 * ttl / 2); time.Now().Before(end); time.Sleep(ttl / 8) {
			if g, err = store.Renew(ctx, g); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []string{names[1], names[50], names[99], "single"} {
			if got := f.state(t, n); got != "held by holder-a token=1" {
				t.Fatalf("%s after renewing %s only, for 1.5 TTLs: %s", n, g.Name, got)
			}
		}
		renewed, lost, err := store.RenewAll(ctx, gs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range gs {
			if lost[i] != nil || renewed[i].Token != 1 {
				t.Fatalf("RenewAll of the batch: %s: %+v, %v", names[i], renewed[i], lost[i])
			}
		}
	})
}

// TestAcquireAllMixed: a batch of names in every state: new (token 1),
// released and expired (token + 1, as Acquire gives), held by another
// holder and held by the holder itself (ErrHeld, unchanged), in any order.
// Each grant equals, apart from Start, what Acquire gives for a name in
// the same state.
func TestAcquireAllMixed(t *testing.T) {
	forEachMode(t, func(t *testing.T, f sessionFixture, store *fencepg.LeaseStore) {
		ctx := t.Context()
		const ttl = time.Minute
		const short = 50 * time.Millisecond
		acquire := func(name, holder string, ttl time.Duration) leasecore.Grant {
			t.Helper()
			g, err := store.Acquire(ctx, name, holder, ttl)
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		// released-2 and ctrl-released: released after two grants (token 2).
		for _, n := range []string{"released-2", "ctrl-released"} {
			if err := store.Release(ctx, acquire(n, "holder-x", ttl)); err != nil {
				t.Fatal(err)
			}
			if err := store.Release(ctx, acquire(n, "holder-x", ttl)); err != nil {
				t.Fatal(err)
			}
		}
		// expired: a short hold by another holder (with holder sessions, on
		// holder-y's short session) that lapses.
		acquire("expired-1", "holder-y", short)
		acquire("ctrl-expired", "holder-y", short)
		acquire("held-other", "holder-b", ttl)
		acquire("held-own", "holder-a", ttl)
		waitExpired(t, f.fixture, "expired-1")
		waitExpired(t, f.fixture, "ctrl-expired")

		// The control: what Acquire gives for a released and an expired name.
		ctrlReleased := acquire("ctrl-released", "holder-a", ttl)
		ctrlExpired := acquire("ctrl-expired", "holder-a", ttl)
		ctrlNew := acquire("ctrl-new", "holder-a", ttl)

		names := []string{"new-1", "held-other", "released-2", "new-2", "expired-1", "held-own", "new-3"}
		gs, errs, err := store.AcquireAll(ctx, names, "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]struct {
			token leasecore.Token
			like  leasecore.Grant
		}{
			"new-1": {1, ctrlNew}, "new-2": {1, ctrlNew}, "new-3": {1, ctrlNew},
			"released-2": {3, ctrlReleased}, "expired-1": {2, ctrlExpired},
		}
		for i, n := range names {
			w, granted := want[n]
			if !granted {
				var he *leasecore.HoldError
				if !errors.Is(errs[i], leasecore.ErrHeld) || !errors.As(errs[i], &he) || he.Name != n || he.Holder != "holder-a" {
					t.Fatalf("%s: %+v, %v; want a HoldError wrapping ErrHeld", n, gs[i], errs[i])
				}
				continue
			}
			if errs[i] != nil {
				t.Fatalf("%s: %v", n, errs[i])
			}
			if gs[i].Name != n || gs[i].Token != w.token {
				t.Fatalf("%s: %+v, want token %d", n, gs[i], w.token)
			}
			sameGrant(t, n, gs[i], w.like)
			if got, want := f.state(t, n), fmt.Sprintf("held by holder-a token=%d", w.token); got != want {
				t.Fatalf("%s: %s, want %s", n, got, want)
			}
		}
		for n, want := range map[string]string{"held-other": "held by holder-b token=1", "held-own": "held by holder-a token=1"} {
			if got := f.state(t, n); got != want {
				t.Fatalf("%s after the refused acquire: %s, want %s", n, got, want)
			}
		}
		if xs := f.xmins(t, []string{"new-1", "new-2", "new-3"}); len(xs) != 1 {
			t.Fatalf("the new names were written by transactions %v, want one", xs)
		}
		// The grants work as Acquire's: renew and release.
		for i, n := range names {
			if errs[i] != nil {
				continue
			}
			g, err := store.Renew(ctx, gs[i])
			if err != nil {
				t.Fatalf("renew of %s: %v", n, err)
			}
			if err := store.Release(ctx, g); err != nil {
				t.Fatalf("release of %s: %v", n, err)
			}
		}
		// A batch of names that all exist writes no session row.
		if store.Shared() {
			sessionBefore := f.rowVersion(t, "holder-c")
			_, errs, err := store.AcquireAll(ctx, []string{"held-other", "held-own"}, "holder-c", time.Hour)
			if err != nil || !errors.Is(errs[0], leasecore.ErrHeld) || !errors.Is(errs[1], leasecore.ErrHeld) {
				t.Fatalf("AcquireAll of held names: %v, %v", errs, err)
			}
			if got := f.rowVersion(t, "holder-c"); got != sessionBefore {
				t.Fatalf("holder-c's session row changed from %q to %q", sessionBefore, got)
			}
		}
	})
}

// TestAcquireAllBadInput: bad input is refused with the field named, and
// writes nothing; so does a context that is already done.
func TestAcquireAllBadInput(t *testing.T) {
	forEachMode(t, func(t *testing.T, f sessionFixture, store *fencepg.LeaseStore) {
		ctx := t.Context()
		before := f.snapshot(t) + f.sessionOf(t, "holder-a")
		for _, tc := range []struct {
			name, field string
			names       []string
			holder      string
			ttl         time.Duration
		}{
			{"no names", "names", nil, "holder-a", time.Minute},
			{"too many names", "names", batchNames("n", backendkit.MaxAcquireAll+1), "holder-a", time.Minute},
			{"empty name", "names[1]", []string{"a", ""}, "holder-a", time.Minute},
			{"NUL in a name", "names[2]", []string{"a", "b", "c\x00"}, "holder-a", time.Minute},
			{"repeated name", "names[1]", []string{"a", "a"}, "holder-a", time.Minute},
			{"empty holder", "holder", []string{"a"}, "", time.Minute},
			{"ttl below MinTTL", "ttl", []string{"a"}, "holder-a", fencepg.MinTTL - 1},
		} {
			gs, errs, err := store.AcquireAll(ctx, tc.names, tc.holder, tc.ttl)
			var ae *leasecore.ArgError
			if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != tc.field || gs != nil || errs != nil {
				t.Fatalf("%s: %v, %v, %v; want an ArgError on %q", tc.name, gs, errs, err, tc.field)
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, _, err := store.AcquireAll(cctx, []string{"a", "b"}, "holder-a", time.Minute); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: %v, want context.Canceled", err)
		}
		if after := f.snapshot(t) + f.sessionOf(t, "holder-a"); after != before {
			t.Fatalf("refused calls changed the tables:\n%s\n---\n%s", before, after)
		}
	})
}

// TestAcquireAllStatements: both statements carry DurableCommit, as every
// statement that issues a token does.
func TestAcquireAllStatements(t *testing.T) {
	for name, stmt := range map[string]string{"AcquireAllNew": pgsql.AcquireAllNew, "AcquireAllNewSession": pgsql.AcquireAllNewSession} {
		if !strings.Contains(stmt, pgsql.DurableCommit) {
			t.Errorf("%s does not carry DurableCommit", name)
		}
	}
}

// TestAcquireAllConcurrent: holders whose batches overlap, sent at once in
// opposite orders, get each name exactly once, with token 1, and no
// statement fails (the new rows are inserted in one order).
func TestAcquireAllConcurrent(t *testing.T) {
	for _, sessions := range []bool{false, true} {
		t.Run(fmt.Sprintf("sessions=%t", sessions), func(t *testing.T) {
			f := newSessionFixture(t, pgopen.Pgx)
			store := f.leases
			if sessions {
				store = f.sess
			}
			names := batchNames("shard", 200)
			const holders = 4
			gs := make([][]leasecore.Grant, holders)
			errs := make([][]error, holders)
			var wg sync.WaitGroup
			for h := range holders {
				mine := slices.Clone(names)
				if h%2 == 1 {
					slices.Reverse(mine)
				}
				wg.Go(func() {
					var err error
					gs[h], errs[h], err = store.AcquireAll(t.Context(), mine, fmt.Sprintf("holder-%d", h), time.Minute)
					if err != nil {
						t.Errorf("holder-%d: %v", h, err)
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			owner := map[string]string{}
			for h := range holders {
				for i, g := range gs[h] {
					switch {
					case errs[h][i] == nil:
						if prev, dup := owner[g.Name]; dup || g.Token != 1 {
							t.Fatalf("%s granted to holder-%d with token %d (also to %q)", g.Name, h, g.Token, prev)
						}
						owner[g.Name] = g.Holder
					case !errors.Is(errs[h][i], leasecore.ErrHeld):
						t.Fatalf("holder-%d: %v", h, errs[h][i])
					}
				}
			}
			if len(owner) != len(names) {
				t.Fatalf("%d of %d names granted", len(owner), len(names))
			}
			for _, n := range []string{names[0], names[199]} {
				if got, want := f.state(t, n), fmt.Sprintf("held by %s token=1", owner[n]); got != want {
					t.Fatalf("%s: %s, want %s", n, got, want)
				}
			}
		})
	}
}

// TestAcquireAllLostAnswer: the answer to the batch statement is lost
// (pgconformance's answer-dropping proxy, as TestHolderSessionLostAcquireAnswer).
// With holder sessions: with pgx the call fails with ErrUnavailable and
// every name is undone at once (free, released, token 1 kept); with lib/pq
// database/sql sends the statement again, which returns the names the
// first execution attached as granted (token 1). Either way no name is
// held that the holder does not know of: after the holder's renewals of
// another name, every name is either the caller's or free.
func TestAcquireAllLostAnswer(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		h, amb, loseNextAnswer := ambiguousSessionHarness(t, driver, "lostall")
		batch := amb.(backendkit.BatchAcquirer)
		reader, err := h.OpenLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insp := reader.(leasecore.LeaseInspector)
		// Warm up: the statement's first use may cost a prepare, whose
		// answer is not the one to lose.
		warm, errs, err := batch.AcquireAll(ctx, []string{"keep"}, "holder-g", 5*time.Second)
		if err != nil || errs[0] != nil {
			t.Fatal(err, errs)
		}
		keep := warm[0]

		names := batchNames("ghost", 5)
		loseNextAnswer()
		gs, errs, err := batch.AcquireAll(ctx, names, "holder-g", 5*time.Second)
		t.Logf("%s: %v, %v", driver, errs, err)
		granted := map[string]bool{}
		switch driver {
		case pgopen.Libpq:
			if err != nil {
				t.Fatalf("lib/pq: %v, want the resent statement's grants", err)
			}
			for i, g := range gs {
				if errs[i] != nil || g.Token != 1 {
					t.Fatalf("lib/pq: %s: %+v, %v; want granted with token 1", names[i], g, errs[i])
				}
				granted[g.Name] = true
			}
		default:
			if !errors.Is(err, leasecore.ErrUnavailable) || gs != nil {
				t.Fatalf("pgx: %v, %v; want a call error wrapping ErrUnavailable", gs, err)
			}
		}
		for range 3 {
			if keep, err = amb.Renew(ctx, keep); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range names {
			st, err := insp.Inspect(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case granted[n] && (!st.Held || st.Holder != "holder-g" || st.Token != 1):
				t.Fatalf("%s, granted: %+v", n, st)
			case !granted[n] && (st.Held || !st.Released || st.Token != 1):
				t.Fatalf("%s, not granted: %+v, want free (released, token 1: the statement took effect and was undone)", n, st)
			}
		}
	})
}

// TestAcquireAllResentStatement: the holder-session batch statement run
// twice with one acquire id — what database/sql does after lib/pq reports
// the connection broken after sending — returns the names the first run
// attached as granted again (the caller gets the grants the lost answer
// carried), and writes no new token; with another acquire id (another
// batch of the same holder) it returns none of them. On a session that was
// replaced meanwhile, the first run's rows are not returned.
func TestAcquireAllResentStatement(t *testing.T) {
	f := newSessionFixture(t, pgopen.Pgx)
	ctx := t.Context()
	run := func(id int64, names ...string) []string {
		t.Helper()
		arg := `["` + strings.Join(names, `","`) + `"]`
		rows, err := f.leaseDB.Query(ctx, pgsql.AcquireAllNewSession, arg, "holder-a", time.Minute.Microseconds(), id)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var name, space string
			if err := rows.Scan(&name, &space); err != nil {
				t.Fatal(err)
			}
			got = append(got, name)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		return got
	}
	if got := run(42, "b", "a"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("first run: %v", got)
	}
	before := f.leaseRow(t, "a") + f.leaseRow(t, "b")
	if got := run(42, "a", "b", "c"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("second run with the same id: %v, want a and b again, and the new c", got)
	}
	if after := f.leaseRow(t, "a") + f.leaseRow(t, "b"); after != before {
		t.Fatalf("the second run changed the rows: %s, was %s", after, before)
	}
	if got := run(43, "a", "b", "c"); len(got) != 0 {
		t.Fatalf("run with another id: %v, want none", got)
	}
	// The session is replaced (it expired and the holder started a new
	// one): the first run's rows hang on the old one and are not returned.
	if _, err := f.leaseDB.Exec(ctx, `UPDATE leasefence.holder_session SET expires_at = now() - interval '1 second' WHERE holder = 'holder-a'`); err != nil {
		t.Fatal(err)
	}
	if got := run(42, "a", "d"); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("run with the same id after the session was replaced: %v, want only the new d", got)
	}
	if got := f.state(t, "a"); got != "free token=1 released=false" {
		t.Fatalf("a, on the replaced session: %s", got)
	}
}

// TestAcquireAllUndoRetried: when the batch's answer is lost and the server
// is unreachable right after (the cut proxy of TestHolderSessionUndoRetried),
// with holder sessions the names stay attached until the holder's next
// renewal through the store, which first runs the pending undos: then every
// name is free and the holder's other name is still held. Without holder
// sessions nothing is undone, as after Acquire: the names lapse at their own
// expiry, unrenewed.
func TestAcquireAllUndoRetried(t *testing.T) {
	for _, sessions := range []bool{false, true} {
		t.Run(fmt.Sprintf("sessions=%t", sessions), func(t *testing.T) {
			f := newSessionFixture(t, pgopen.Pgx)
			ctx := t.Context()
			u, err := url.Parse(f.leaseDSN)
			if err != nil {
				t.Fatal(err)
			}
			proxy := startCutProxy(t, u.Host)
			u.Host = proxy.ln.Addr().String()
			var opts []fencepg.Option
			if sessions {
				opts = append(opts, fencepg.WithSharedLeases())
			}
			store, err := pgtest.Open(t, pgopen.Pgx, u.String(), 1).LeaseStore(opts...)
			if err != nil {
				t.Fatal(err)
			}
			ttl := 10 * time.Second
			if !sessions {
				ttl = 300 * time.Millisecond
			}
			// Also prepares the statement.
			kept, errs, err := store.AcquireAll(ctx, []string{"keep"}, "holder-g", ttl)
			if err != nil || errs[0] != nil {
				t.Fatal(err, errs)
			}
			names := batchNames("ghost", 3)
			proxy.setCut(true)
			if _, _, err := store.AcquireAll(ctx, names, "holder-g", ttl); !errors.Is(err, leasecore.ErrUnavailable) {
				t.Fatalf("AcquireAll whose answer was dropped: %v, want ErrUnavailable", err)
			}
			for _, n := range names {
				if got := f.state(t, n); got != "held by holder-g token=1" {
					t.Fatalf("%s while the server is unreachable: %s, want held (the statement took effect)", n, got)
				}
			}
			proxy.setCut(false)
			if !sessions {
				for _, n := range names {
					waitExpired(t, f.fixture, n)
					if got := f.state(t, n); got != "free token=1 released=false" {
						t.Fatalf("%s: %s, want expired", n, got)
					}
				}
				return
			}
			if err := afterCrash(ctx, func() (err error) { kept[0], err = store.Renew(ctx, kept[0]); return err }); err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if got := f.state(t, n); got != "free token=1 released=true" {
					t.Fatalf("%s after holder-g's next renewal: %s, want free (the pending undo ran first)", n, got)
				}
			}
			if got := f.state(t, "keep"); got != "held by holder-g token=1" {
				t.Fatalf("keep: %s", got)
			}
		})
	}
}

// TestAcquireAllSessionSet: a SessionSet on a store with holder sessions
// acquires 100 new names with one statement (one transaction wrote their
// rows) and holds them; Close releases them.
func TestAcquireAllSessionSet(t *testing.T) {
	f := newSessionFixture(t, pgopen.Pgx)
	set, err := leasecore.NewSessionSet(f.sess, "holder-a", leasecore.WithTTL(5*time.Second), leasecore.WithRenewInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	names := batchNames("shard", 100)
	tokens, errs, err := set.AcquireAll(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	for i := range names {
		if errs[i] != nil || tokens[i] != 1 || !set.Valid(names[i]) {
			t.Fatalf("%s: %d, %v", names[i], tokens[i], errs[i])
		}
	}
	if xs := f.xmins(t, names); len(xs) != 1 {
		t.Fatalf("the names' rows were written by transactions %v, want one", xs)
	}
	if err := set.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{names[0], names[99]} {
		if got := f.state(t, n); got != "free token=1 released=true" {
			t.Fatalf("%s after Close: %s", n, got)
		}
	}
}
