package fenceetcd_test

import (
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// lineLog writes the suite's report to the test log, a line at a time.
type lineLog struct{ t *testing.T }

func (l lineLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestConformanceCluster runs the cases about servers failing on a
// 3-member etcd cluster (etcdtemp.StartCluster, members on 127.0.0.1-3)
// instead of a lone server:
//
//   - F8, server crash: Crash is etcdconformance.CrashLeader, SIGKILL to the
//     Raft leader, which is restarted on its data directory once the others
//     have elected a leader and acknowledge writes again. The lease, the
//     floor and the token counter must survive the leader's death.
//   - F4, paused stale holder: the holder processes connect to all three
//     endpoints.
//   - F16, failover: the harness starts a 3-member cluster of its own
//     (Config.ReplicaMembers) and kills its leader without restarting it;
//     etcd has no asynchronous replication, so the negative control skips.
//
// conformance.Run cannot select cases, so this runs conformance.Report with
// the case IDs and fails on any failed check. It runs with an etcd lease per
// acquire and with shared leases, whose renewals must survive a leader
// change too.
func TestConformanceCluster(t *testing.T) {
	t0 := time.Now()
	cl := etcdtemp.StartClusterTB(t, 3)
	t.Logf("cluster of 3 started in %v: %s", time.Since(t0).Round(time.Millisecond), cl.Describe())
	for _, mode := range []struct {
		name   string
		shared bool
	}{{"per-acquire-lease", false}, {"shared-leases", true}} {
		t.Run(mode.name, func(t *testing.T) {
			newHarness := etcdconformance.New(etcdconformance.Config{
				Endpoints:      cl.Endpoints(),
				HolderArgs:     []string{"-test.run=^$"}, // TestMain turns the binary into the holder
				Crash:          etcdconformance.CrashLeader(cl),
				SharedLeases:   mode.shared,
				ReplicaMembers: 3,
			})
			sum, err := conformance.Report(t.Context(), lineLog{t}, newHarness, conformance.ReportOptions{
				Cases: []string{"F8", "F4", "F16"},
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range sum.Cases {
				t.Logf("%s: passed=%d failed=%d skipped=%q in %v", c.ID, c.Passed, c.Failed, c.Skipped, c.Elapsed.Round(time.Millisecond))
				if c.Skipped != "" || c.Passed == 0 {
					t.Errorf("%s did not run on the cluster: %s", c.ID, c.Skipped)
				}
			}
			if sum.Failed > 0 {
				t.Fatalf("%d checks failed on the 3-member cluster", sum.Failed)
			}
		})
	}
	// Every member still runs: CrashLeader restarted each leader it killed.
	for i := range cl.Len() {
		if cl.PID(i) == 0 {
			t.Errorf("member %d is down after the suite", i)
		}
	}
}
