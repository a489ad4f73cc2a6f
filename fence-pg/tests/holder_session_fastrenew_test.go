package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// leaseReads returns how many scans of the lease table (sequential and
// index) the server has counted, after making pool's one backend flush its
// statistics: what a RenewAll through pool read of the lease rows.
func (f *fixture) leaseReads(t *testing.T, pool pgopen.Pool) int64 {
	t.Helper()
	ctx := t.Context()
	if _, err := pgtest.DB(pool).Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	read := func() int64 {
		var n int64
		if err := f.leaseDB.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
			FROM pg_stat_user_tables WHERE schemaname = 'leasefence' AND relname = 'lease'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The flush happens when the backend next goes idle; wait for the
	// counter to stop moving.
	n := read()
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		n2 := read()
		if n2 == n {
			break
		}
		n = n2
	}
	return n
}

// acquireShards acquires n names for holder through store.
func acquireShards(t *testing.T, store *fencepg.LeaseStore, holder string, n int, ttl time.Duration) []leasecore.Grant {
	t.Helper()
	gs := make([]leasecore.Grant, n)
	for i := range gs {
		var err error
		if gs[i], err = store.Acquire(t.Context(), fmt.Sprintf("%s-shard-%03d", holder, i), holder, ttl); err != nil {
			t.Fatal(err)
		}
	}
	return gs
}

// renewAllWant runs RenewAll of gs and checks that exactly the grants at
// indexes lostAt are lost (each with an error wrapping ErrLost whose text
// says why), the others renewed with their tokens.
func renewAllWant(t *testing.T, store *fencepg.LeaseStore, gs []leasecore.Grant, why string, lostAt ...int) {
	t.Helper()
	renewed, lost, err := store.RenewAll(t.Context(), gs)
	if err != nil {
		t.Fatal(err)
	}
	isLost := map[int]bool{}
	for _, i := range lostAt {
		isLost[i] = true
	}
	for i, g := range gs {
		switch {
		case isLost[i]:
			wantLost(t, fmt.Sprintf("RenewAll: %s", g.Name), lost[i], why)
		case lost[i] != nil:
			t.Fatalf("RenewAll: %s lost: %v", g.Name, lost[i])
		case renewed[i].Token != g.Token || renewed[i].Name != g.Name:
			t.Fatalf("RenewAll: %s renewed as %+v", g.Name, renewed[i])
		}
	}
}

// TestHolderSessionRenewAllReadsNoLeaseRow: with holder sessions, the first
// RenewAll of a holder's names checks every lease row (the server's scan
// counters of the lease table move); the next ones, while no name left the
// session, update the session row and do not touch the lease table at all.
// That is what makes a holder's renewal as cheap as one single-row update.
//
// The second half is shown with a lock, not with the scan counters: another
// transaction holds the lease table ACCESS EXCLUSIVE while those renewals
// run, so a statement that read the table — or only named it, which takes
// a lock when it is planned — would wait until the renewals' deadline. The
// counters are shared by every backend of the database, and an idle
// backend of an earlier fixture may flush its counts at any moment up to
// seconds later (PostgreSQL's cumulative statistics), which once added a
// scan to an otherwise clean count.
func TestHolderSessionRenewAllReadsNoLeaseRow(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		pool := pgtest.Open(t, driver, f.leaseDSN, 1) // one backend: its statistics are the store's
		store, err := pool.LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		gs := acquireShards(t, store, "holder-a", 100, time.Minute)
		before := f.leaseReads(t, pool)
		renewAllWant(t, store, gs, "")
		first := f.leaseReads(t, pool)
		if first == before {
			t.Fatalf("the first RenewAll read no lease row (scans %d -> %d): it cannot have checked the names", before, first)
		}
		t.Logf("lease table scans: %d before, %d after the first RenewAll", before, first)
		sessionRow := f.rowVersion(t, "holder-a")

		locker, err := pgx.Connect(t.Context(), f.leaseDSN)
		if err != nil {
			t.Fatal(err)
		}
		defer locker.Close(context.Background())
		lockTx, err := locker.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lockTx.Exec(t.Context(), `LOCK TABLE leasefence.lease IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		// Any bound shows the point: a renewal that touched the table would
		// wait for the lock for ever. This one is generous for a loaded
		// machine, where four single-row updates take milliseconds.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		for _, sub := range [][]leasecore.Grant{gs, gs, gs, gs[10:20]} { // a subset too: the session renews all its names anyway
			renewed, lost, err := store.RenewAll(ctx, sub)
			if err != nil {
				cancel()
				t.Fatalf("RenewAll while the lease table is locked: %v (it touched the lease table)", err)
			}
			for i, g := range sub {
				if lost[i] != nil || renewed[i].Token != g.Token {
					cancel()
					t.Fatalf("RenewAll while the lease table is locked: %s renewed %+v lost %v", g.Name, renewed[i], lost[i])
				}
			}
		}
		cancel()
		if err := lockTx.Rollback(t.Context()); err != nil {
			t.Fatal(err)
		}
		if f.rowVersion(t, "holder-a") == sessionRow {
			t.Fatal("the fast RenewAll did not update the session row")
		}
	})
}

// TestHolderSessionRenewAllSeesEveryDetach: whatever takes a name off a
// holder's session — a release through another store of the holder, a
// take-over by another holder or by the same one (a new token on the same
// session), an operator's UPDATE by hand, the session's expiry — the
// holder's next RenewAll reports exactly that name lost and renews the
// others, although its earlier renewals took the fast path. The trigger
// lease_detached_from_session counts every such change in the session's
// generation; without it (dropped below) the fast path would report the
// name renewed, and CheckSchema refuses the schema.
func TestHolderSessionRenewAllSeesEveryDetach(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := t.Context()
		store, err := f.leasePool.LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		other, err := pgtest.Open(t, driver, f.leaseDSN, 2).LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		const ttl = time.Minute
		gs := acquireShards(t, store, "holder-a", 8, ttl)
		renewAllWant(t, store, gs, "") // full check
		renewAllWant(t, store, gs, "") // fast path

		// 1. Released through another store of the same holder.
		if err := other.Release(ctx, gs[1]); err != nil {
			t.Fatal(err)
		}
		renewAllWant(t, store, gs, "released", 1)
		gs = append(gs[:1], gs[2:]...)
		renewAllWant(t, store, gs, "")

		// 2. Taken over by another holder (an operator's store without the mode).
		if _, _, err := f.leases.TakeOver(ctx, gs[2].Name, "holder-b", ttl); err != nil {
			t.Fatal(err)
		}
		renewAllWant(t, store, gs, "superseded", 2)
		gs = append(gs[:2], gs[3:]...)
		renewAllWant(t, store, gs, "")

		// 3. Taken over by the same holder: same session, token + 1.
		newer, _, err := store.TakeOver(ctx, gs[3].Name, "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if newer.Token != gs[3].Token+1 {
			t.Fatalf("take-over gave token %d, want %d", newer.Token, gs[3].Token+1)
		}
		renewAllWant(t, store, gs, "superseded", 3)
		gs[3] = newer
		renewAllWant(t, store, gs, "")

		// 4. An operator's UPDATE by hand (the recovery SQL, on one name).
		if _, err := f.leaseDB.Exec(ctx, `UPDATE leasefence.lease SET session_id = NULL, acquire_id = NULL, expires_at = '-infinity' WHERE name = $1`, gs[0].Name); err != nil {
			t.Fatal(err)
		}
		renewAllWant(t, store, gs, "released", 0)
		gs = gs[1:]
		renewAllWant(t, store, gs, "")

		// 5. The session expired: every name is lost.
		endSession(t, f.leaseDB, "holder-a")
		all := make([]int, len(gs))
		for i := range all {
			all[i] = i
		}
		renewAllWant(t, store, gs, "holder session", all...)

		// Without the trigger the fast path is blind to a detach; the
		// schema check says so.
		gs = acquireShards(t, store, "holder-c", 3, ttl)
		renewAllWant(t, store, gs, "")
		if _, err := f.leaseDB.Exec(ctx, `DROP TRIGGER lease_detached_from_session ON leasefence.lease`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := f.leases.Migrate(context.Background()); err != nil {
				t.Error(err)
			}
		})
		err = store.CheckSchema(ctx)
		if err == nil || !strings.Contains(err.Error(), "lease_detached_from_session") {
			t.Fatalf("CheckSchema without the trigger: %v, want an error naming it", err)
		}
		if err := f.leases.CheckSchema(ctx); err != nil {
			t.Fatalf("CheckSchema of a store without holder sessions wants the trigger: %v", err)
		}
		if err := other.Release(ctx, gs[0]); err != nil {
			t.Fatal(err)
		}
		renewed, lost, err := store.RenewAll(ctx, gs)
		if err != nil {
			t.Fatal(err)
		}
		if lost[0] != nil || renewed[0].Token != gs[0].Token {
			t.Fatalf("without the trigger the fast path was expected to miss the release (the control of this test), got lost=%v", lost[0])
		}
		t.Log("control: without the trigger a released name is reported renewed by the fast path")
		if err := f.leases.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := store.CheckSchema(ctx); err != nil {
			t.Fatalf("Migrate did not restore the trigger: %v", err)
		}
	})
}

// TestHolderSessionRenewAllGathersConcurrentRenewals: many holders renewing
// at once through one store, each with names of its own, are all renewed
// correctly, in fewer commits than renewals (the store gathers concurrent
// fast renewals into one statement); a holder one of whose names another
// store released meanwhile gets exactly that name reported lost, while the
// others' renewals ride on together.
func TestHolderSessionRenewAllGathersConcurrentRenewals(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := t.Context()
		pool := pgtest.Open(t, driver, f.leaseDSN, 1) // one backend: its statistics are the store's
		store, err := pool.LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		other, err := f.leasePool.LeaseStore(fencepg.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		const holders, names, rounds = 24, 5, 10
		grants := make([][]leasecore.Grant, holders)
		for h := range grants {
			grants[h] = acquireShards(t, store, fmt.Sprintf("holder-%02d", h), names, time.Minute)
			renewAllWant(t, store, grants[h], "") // the full check, once
		}
		commits := func() int64 {
			t.Helper()
			if _, err := pgtest.DB(pool).Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			var n int64
			if err := f.leaseDB.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := commits()
		// Holder 0 loses one name midway, through another store.
		reached, released := make(chan struct{}), make(chan struct{})
		errs := make(chan error, holders*rounds+1)
		var wg sync.WaitGroup
		for h := range holders {
			wg.Go(func() {
				for r := range rounds {
					if h == 0 && r == rounds/2 {
						close(reached)
						<-released
					}
					renewed, lost, err := store.RenewAll(ctx, grants[h])
					if err != nil {
						errs <- err
						return
					}
					for i, g := range grants[h] {
						wantGone := h == 0 && r >= rounds/2 && i == 1
						switch {
						case wantGone && !errors.Is(lost[i], leasecore.ErrLost):
							errs <- fmt.Errorf("round %d: %s released by another store, RenewAll says lost=%v", r, g.Name, lost[i])
						case !wantGone && (lost[i] != nil || renewed[i].Token != g.Token):
							errs <- fmt.Errorf("round %d: %s: renewed %+v, lost %v", r, g.Name, renewed[i], lost[i])
						}
					}
				}
			})
		}
		<-reached
		if err := other.Release(ctx, grants[0][1]); err != nil {
			t.Fatal(err)
		}
		close(released)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		after := commits()
		t.Logf("%d renewals by %d holders at once through one store: %d commits in the database (stats reads included)",
			holders*rounds, holders, after-before)
		if after-before >= holders*rounds {
			t.Fatalf("%d concurrent renewals took %d commits: the store did not gather them", holders*rounds, after-before)
		}
	})
}
