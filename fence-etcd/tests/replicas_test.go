package fenceetcd_test

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestReplicasContract checks the etcd harness's conformance.Replicas
// around what F16 itself exercises: the modes etcd has and has not, the
// lagging standby it cannot have, a second failover refused when no quorum
// would remain, and that the harness's Close stops the cluster.
func TestReplicasContract(t *testing.T) {
	ctx := t.Context()
	for _, n := range []int{1, 2, -1} {
		if _, err := etcdconformance.New(etcdconformance.Config{Endpoints: []string{"x"}, ReplicaMembers: n})(ctx); !errors.Is(err, leasecore.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), "ReplicaMembers") {
			t.Errorf("ReplicaMembers %d: %v, want an error naming ReplicaMembers, wrapping ErrInvalidArgument", n, err)
		}
	}
	off, err := etcdconformance.New(etcdconformance.Config{Endpoints: []string{"x"}})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if why := off.Traits().Absent[conformance.AbilityReplicas]; !strings.Contains(why, "ReplicaMembers") {
		t.Errorf("ReplicaMembers 0: AbilityReplicas absent because %q, want the reason to name ReplicaMembers", why)
	}
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}

	h, err := etcdconformance.New(etcdconformance.Config{Endpoints: etcdtest.Server(t).Endpoints(), ReplicaMembers: 3})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = h.Close()
		}
	})
	if why, absent := h.Traits().Absent[conformance.AbilityReplicas]; absent {
		t.Fatalf("AbilityReplicas absent with ReplicaMembers 3: %s", why)
	}
	rp := h.(conformance.Replicas)
	if _, err := rp.StartReplicas(ctx, conformance.ReplicationAsynchronous); !errors.Is(err, errors.ErrUnsupported) ||
		!strings.Contains(err.Error(), "no asynchronous mode") {
		t.Errorf("asynchronous: %v, want errors.ErrUnsupported saying etcd has no asynchronous mode", err)
	}
	if _, err := rp.StartReplicas(ctx, "semi-synchronous"); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("unknown mode: %v, want ErrInvalidArgument", err)
	}

	t0 := time.Now()
	rs, err := rp.StartReplicas(ctx, conformance.ReplicationSynchronous)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started in %v: %s", time.Since(t0).Round(time.Millisecond), rs.Describe())
	for _, want := range []string{"3 members", "2 of 3", "127.0.0.1:", "127.0.0.2:", "127.0.0.3:"} {
		if !strings.Contains(rs.Describe(), want) {
			t.Errorf("Describe() lacks %q", want)
		}
	}
	if err := rs.HoldBackStandby(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("HoldBackStandby: %v, want errors.ErrUnsupported", err)
	}

	lease, err := rs.OpenLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rs.OpenResource(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := lease.Acquire(ctx, "replicas", "holder-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := res.Write(ctx, leasecore.Write{Scope: "replicas", Part: "p", Content: "x", Writer: "holder-a", Token: g.Token}); err != nil || !r.Accepted {
		t.Fatalf("write before the failover: %+v, %v", r, err)
	}
	how, downtime, err := rs.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: %s (writes down for %v)", how, downtime.Round(time.Millisecond))
	if !strings.Contains(how, "SIGKILL to the Raft leader") || !strings.Contains(how, "not restarted") || downtime <= 0 {
		t.Errorf("Failover = %q, %v", how, downtime)
	}
	st := retryUnavailable(t, func(ctx context.Context) (leasecore.LeaseState, error) {
		return lease.(leasecore.LeaseInspector).Inspect(ctx, "replicas")
	})
	if st.Holder != "holder-a" || st.Token != g.Token {
		t.Errorf("after the failover the lease is %+v, want holder-a with token %d", st, g.Token)
	}
	floor := retryUnavailable(t, func(ctx context.Context) (leasecore.Token, error) { return res.Floor(ctx, "replicas") })
	if floor != g.Token {
		t.Errorf("after the failover the floor is %d, want %d", floor, g.Token)
	}
	// Two of three run: killing the next leader would leave one, no quorum.
	if _, _, err := rs.Failover(ctx); err == nil || !strings.Contains(err.Error(), "no quorum") {
		t.Errorf("a second failover: %v, want a refusal (no quorum would remain)", err)
	}

	closed = true
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Acquire(ctx, "replicas", "holder-b", time.Second); err == nil {
		t.Error("the replica set's lease client works after the harness's Close")
	}
	// Close stopped the cluster: no member's client or peer address answers.
	addrs := regexp.MustCompile(`127\.0\.0\.[0-9]+:[0-9]+`).FindAllString(rs.Describe(), -1)
	if len(addrs) < 9 {
		t.Fatalf("Describe() names %d addresses, want 3 per member: %s", len(addrs), rs.Describe())
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the harness's Close", a)
		}
	}
}

// retryUnavailable calls f until it returns anything but an error wrapping
// leasecore.ErrUnavailable, for up to 30 seconds (what F16 allows).
func retryUnavailable[T any](t *testing.T, f func(context.Context) (T, error)) T {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := f(t.Context())
		if err == nil {
			return v
		}
		if !errors.Is(err, leasecore.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
