package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// The ReplicaSet contract of pgconformance (conformance.Replicas), on a real
// primary and standby, through the public lease and resource APIs: what
// F16 relies on. Synchronous: nothing acknowledged is lost in a failover.
// Asynchronous, held back: a token already handed out is handed out again.

// replicaTimeout is how long a call through a replica set is retried
// while it fails with leasecore.ErrUnavailable (the contract's 30 seconds).
const replicaTimeout = 30 * time.Second

// startReplicaSet builds the pgconformance harness on the test binary's
// cluster and starts a replica set of it; the harness's Close, at the end
// of the test, stops the pair.
func startReplicaSet(t *testing.T, driver string, mode conformance.ReplicationMode) conformance.ReplicaSet {
	t.Helper()
	ctx := t.Context()
	h, err := pgconformance.New(pgconformance.Config{
		Driver:      driver,
		LeaseDSN:    pgtest.CreateDB(t, "lease_rs"),
		ResourceDSN: pgtest.CreateDB(t, "res_rs"),
		Cluster:     pgtest.Cluster(t),
	})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("harness Close: %v", err)
		}
	})
	if why, absent := h.Traits().Absent[conformance.AbilityReplicas]; absent {
		t.Fatalf("AbilityReplicas declared absent on a local cluster: %s", why)
	}
	r, ok := h.(conformance.Replicas)
	if !ok {
		t.Fatal("the harness does not implement conformance.Replicas")
	}
	t0 := time.Now()
	rs, err := r.StartReplicas(ctx, mode)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replica set started in %v: %s", time.Since(t0).Round(time.Millisecond), rs.Describe())
	return rs
}

// retry calls f until it returns anything but an error wrapping
// leasecore.ErrUnavailable (or one of also), for up to replicaTimeout.
func retry[T any](t *testing.T, what string, f func(context.Context) (T, error), also ...error) T {
	t.Helper()
	deadline := time.Now().Add(replicaTimeout)
	for {
		v, err := f(t.Context())
		if err == nil {
			return v
		}
		again := errors.Is(err, leasecore.ErrUnavailable)
		for _, e := range also {
			again = again || errors.Is(err, e)
		}
		if !again || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeAs writes content for holder g through res and returns the result.
func writeAs(t *testing.T, res conformance.Resource, g leasecore.Grant, content string) leasecore.Result {
	t.Helper()
	w := leasecore.Write{Scope: "f16", Part: "summary", Content: content, Writer: g.Holder, Token: g.Token, Space: g.Space}
	return retry(t, fmt.Sprintf("write by %s with token %d", g.Holder, g.Token),
		func(ctx context.Context) (leasecore.Result, error) { return res.Write(ctx, w) })
}

func acquireAs(t *testing.T, lease leasecore.Lease, holder string, ttl time.Duration) leasecore.Grant {
	t.Helper()
	// ErrHeld too: after an asynchronous failover the promoted standby may
	// still show a holding period the lost primary had ended.
	return retry(t, "acquire by "+holder,
		func(ctx context.Context) (leasecore.Grant, error) { return lease.Acquire(ctx, "f16", holder, ttl) }, leasecore.ErrHeld)
}

func releaseAs(t *testing.T, lease leasecore.Lease, g leasecore.Grant) {
	t.Helper()
	if err := lease.Release(t.Context(), g); err != nil {
		t.Fatalf("release by %s: %v", g.Holder, err)
	}
}

func TestReplicaSetFailover(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		t.Run("synchronous", func(t *testing.T) { testSynchronousFailover(t, driver) })
		t.Run("asynchronous", func(t *testing.T) { testAsynchronousFailover(t, driver) })
	})
}

// testSynchronousFailover: the primary crashes after a's and b's grants
// and writes; on the promoted standby b's lease and the floor are there,
// the next token is larger than every token handed out, and a's stale
// write is rejected.
func testSynchronousFailover(t *testing.T, driver string) {
	ctx := t.Context()
	rs := startReplicaSet(t, driver, conformance.ReplicationSynchronous)
	lease, err := rs.OpenLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rs.OpenResource(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.HoldBackStandby(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("HoldBackStandby in synchronous mode: %v, want errors.ErrUnsupported", err)
	}

	a := acquireAs(t, lease, "a", 30*time.Second)
	if r := writeAs(t, res, a, "by a"); !r.Accepted {
		t.Fatalf("a's write rejected: %+v", r)
	}
	releaseAs(t, lease, a)
	b := acquireAs(t, lease, "b", 30*time.Second)
	if b.Token <= a.Token {
		t.Fatalf("b's token %d after a's %d", b.Token, a.Token)
	}
	if r := writeAs(t, res, b, "by b"); !r.Accepted {
		t.Fatalf("b's write rejected: %+v", r)
	}

	how, downtime, err := rs.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: %s; downtime %v", how, downtime.Round(time.Millisecond))

	floor := retry(t, "floor", func(ctx context.Context) (leasecore.Token, error) { return res.Floor(ctx, "f16") })
	if floor != b.Token {
		t.Errorf("floor after failover = %d, want b's %d: an acknowledged write was lost", floor, b.Token)
	}
	st := retry(t, "inspect", func(ctx context.Context) (leasecore.LeaseState, error) {
		return lease.(leasecore.LeaseInspector).Inspect(ctx, "f16")
	})
	if st.Holder != "b" || st.Token != b.Token || !st.Held {
		t.Errorf("lease after failover: %+v, want held by b with token %d", st, b.Token)
	}
	releaseAs(t, lease, b)
	c := acquireAs(t, lease, "c", 30*time.Second)
	if c.Token <= b.Token {
		t.Errorf("c's token %d after the failover is not larger than b's %d: a token was handed out twice", c.Token, b.Token)
	}
	if r := writeAs(t, res, c, "by c"); !r.Accepted {
		t.Errorf("c's write rejected: %+v", r)
	}
	if r := writeAs(t, res, a, "late a"); r.Accepted || r.Floor != c.Token {
		t.Errorf("a's stale write after the failover: %+v, want rejected by c's %d", r, c.Token)
	}
}

// testAsynchronousFailover is the negative control: the standby is held
// back after a's grant and write; b's grant and write are acknowledged by
// the primary alone and lost in the failover, so the promoted standby
// hands b's token out again, to c, and both b's and c's writes with it are
// accepted.
func testAsynchronousFailover(t *testing.T, driver string) {
	ctx := t.Context()
	rs := startReplicaSet(t, driver, conformance.ReplicationAsynchronous)
	lease, err := rs.OpenLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rs.OpenResource(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// A short TTL: the standby never learns of a's release, so c waits
	// for a's holding period to end there.
	a := acquireAs(t, lease, "a", 2*time.Second)
	if r := writeAs(t, res, a, "by a"); !r.Accepted {
		t.Fatalf("a's write rejected: %+v", r)
	}
	if err := rs.HoldBackStandby(ctx); err != nil {
		t.Fatal(err)
	}
	releaseAs(t, lease, a)
	b := acquireAs(t, lease, "b", 30*time.Second)
	if r := writeAs(t, res, b, "by b"); !r.Accepted || r.Floor != b.Token {
		t.Fatalf("b's write: %+v, want accepted at %d", r, b.Token)
	}

	how, downtime, err := rs.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: %s; downtime %v", how, downtime.Round(time.Millisecond))

	floor := retry(t, "floor", func(ctx context.Context) (leasecore.Token, error) { return res.Floor(ctx, "f16") })
	if floor != a.Token {
		t.Errorf("floor after failover = %d, want a's %d: the held-back standby should not have b's write (%d)", floor, a.Token, b.Token)
	}
	c := acquireAs(t, lease, "c", 30*time.Second)
	if c.Token != b.Token {
		t.Fatalf("c's token after the failover = %d; want b's %d handed out again, which is what this negative control shows", c.Token, b.Token)
	}
	t.Logf("token %d handed out twice: to b by the lost primary, to c by the promoted asynchronous standby", c.Token)
	rc, rb := writeAs(t, res, c, "by c"), writeAs(t, res, b, "late b")
	if !rc.Accepted || !rb.Accepted {
		t.Errorf("c's write %+v, b's write %+v: with one token for two holders the fence accepts both", rc, rb)
	}
}

// TestAsyncFailoverRecoverySQL checks the recovery step proposed for an
// asynchronous standby promoted anyway, run on the promoted server before
// the applications reconnect: every lease's token raised by a margin
// larger than the number of tokens the lost primary can have handed out
// past what the standby received, and every lease released. The triggers
// that keep tokens from going down let it pass without the administrative
// setting (it only raises them). Then every holder of the old state loses
// its lease at its next renewal, the next grant is larger than every token
// ever handed out, and once the new holder has written, a holder of a
// token from the lost primary is rejected. Until then such a holder may
// still write, as any stale holder may before the next holder's first
// write (the floor went back with the server): one token still has one
// holder, which is what the fence needs.
func TestAsyncFailoverRecoverySQL(t *testing.T) {
	ctx := t.Context()
	pair, err := pgtemp.StartStandbyPair(ctx, false, pgtemp.WithBinDir(pgtest.Cluster(t).BinDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pair.Stop(); err != nil {
			t.Errorf("pair Stop: %v", err)
		}
	})
	if err := pair.Primary().CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	// Both schemas in one database of the pair; each pool is closed before
	// the server it talks to goes away.
	open := func(c *pgtemp.Cluster) (*fencepg.LeaseStore, *fencepg.Resource, func()) {
		pool, err := pgopen.Open(ctx, pgopen.Pgx, c.DSN("app"), 4)
		if err != nil {
			t.Fatal(err)
		}
		leases, err := pool.LeaseStore()
		if err != nil {
			t.Fatal(err)
		}
		res, err := pool.Resource()
		if err != nil {
			t.Fatal(err)
		}
		return leases, res, func() { _ = pool.Close() }
	}
	leases, res, closePrimary := open(pair.Primary())
	if err := leases.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := res.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	a := acquireAs(t, leases, "a", time.Second)
	if r := writeAs(t, res, a, "by a"); !r.Accepted {
		t.Fatalf("a's write: %+v", r)
	}
	releaseAs(t, leases, a)
	// d holds another lease, on both servers: the recovery step ends it.
	d, err := leases.Acquire(ctx, "other", "d", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pair.FreezeStandby(ctx); err != nil {
		t.Fatal(err)
	}
	b := acquireAs(t, leases, "b", 30*time.Second) // lost with the primary
	if r := writeAs(t, res, b, "by b"); !r.Accepted {
		t.Fatalf("b's write: %+v", r)
	}
	closePrimary()
	if err := pair.CrashPrimary(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pair.ThawStandby(); err != nil {
		t.Fatal(err)
	}
	if _, err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	// The recovery step. 1,000,000 stands for "more acquires than the lost
	// primary can have committed past what the standby received".
	// session_id and acquire_id: names on a holder session (fencepg.WithSharedLeases)
	// are held while their session lives, whatever expires_at says.
	const recovery = `UPDATE leasefence.lease SET token = token + 1000000, expires_at = '-infinity', session_id = NULL, acquire_id = NULL`
	conn := pgtest.Open(t, pgopen.Libpq, pair.Standby().DSN("app"), 1)
	if _, err := conn.SQL.ExecContext(ctx, recovery); err != nil {
		t.Fatalf("recovery step: %v", err)
	}

	leases, res, closeStandby := open(pair.Standby())
	defer closeStandby()
	if _, err := leases.Renew(ctx, d); !errors.Is(err, leasecore.ErrLost) {
		t.Errorf("d's renewal after the recovery step: %v, want leasecore.ErrLost", err)
	}
	if r := writeAs(t, res, b, "late b"); !r.Accepted || r.Floor != b.Token {
		t.Errorf("b's write with token %d before any new holder wrote: %+v; want accepted (the floor went back to %d with the server)", b.Token, r, a.Token)
	}
	c := acquireAs(t, leases, "c", 30*time.Second)
	if c.Token != a.Token+1000001 || c.Token <= b.Token {
		t.Errorf("c's token %d after the recovery step, want a's %d + 1000001, larger than the lost primary's %d", c.Token, a.Token, b.Token)
	}
	if r := writeAs(t, res, c, "by c"); !r.Accepted {
		t.Errorf("c's write after the recovery step: %+v, want accepted", r)
	}
	if r := writeAs(t, res, b, "late b"); r.Accepted || r.Floor != c.Token {
		t.Errorf("b's write with token %d from the lost primary after c's: %+v, want rejected by %d", b.Token, r, c.Token)
	}
	t.Logf("after the recovery step: d's lease ended, the next grant is %d, the lost primary's token %d rejected once c wrote", c.Token, b.Token)
}

// TestReplicaSetAbsentWithoutCluster: a harness with no local cluster to
// take binaries from declares AbilityReplicas absent and says why, and
// StartReplicas refuses with errors.ErrUnsupported; a mode that is neither
// is bad input naming the field.
func TestReplicaSetAbsentWithoutCluster(t *testing.T) {
	ctx := t.Context()
	newHarness := func(cluster *pgtemp.Cluster) conformance.Harness {
		h, err := pgconformance.New(pgconformance.Config{
			Driver:      pgopen.Pgx,
			LeaseDSN:    pgtest.CreateDB(t, "lease_rs"),
			ResourceDSN: pgtest.CreateDB(t, "res_rs"),
			Cluster:     cluster,
		})(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		return h
	}
	h := newHarness(nil)
	why := h.Traits().Absent[conformance.AbilityReplicas]
	if why == "" {
		t.Error("AbilityReplicas not declared absent without Config.Cluster")
	}
	t.Logf("absent: %s", why)
	_, err := h.(conformance.Replicas).StartReplicas(ctx, conformance.ReplicationSynchronous)
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("StartReplicas without Config.Cluster: %v, want errors.ErrUnsupported", err)
	}
	_, err = newHarness(pgtest.Cluster(t)).(conformance.Replicas).StartReplicas(ctx, "semi-synchronous")
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !strings.Contains(err.Error(), "mode") {
		t.Errorf("StartReplicas with a bad mode: %v, want leasecore.ErrInvalidArgument naming mode", err)
	}
}
