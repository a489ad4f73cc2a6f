package fenceetcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// TestConformance runs the leasefence conformance suite against fenceetcd
// on a server of its own (F8 kills it), with etcdtemp's short raft timings
// (heartbeat 10ms, election 100ms), which make the server's minimum lease
// TTL one second. It runs twice: with an etcd lease per acquire (the
// default) and with fenceetcd.WithSharedLeases, where every lease store —
// the holder processes' of F4 and F5 included — attaches all names of one
// holder to one etcd lease.
func TestConformance(t *testing.T) {
	srv := etcdtemp.StartTB(t)
	for _, mode := range []struct {
		name   string
		shared bool
	}{{"per-acquire-lease", false}, {"shared-leases", true}} {
		t.Run(mode.name, func(t *testing.T) {
			conformance.Run(t, etcdconformance.New(etcdconformance.Config{
				Endpoints:  srv.Endpoints(),
				HolderArgs: []string{"-test.run=^$"}, // TestMain turns the binary into the holder
				Crash: func(ctx context.Context) (string, time.Duration, error) {
					d, err := srv.KillRestart(ctx)
					return "SIGKILL to the etcd server process, restart on the same data directory", d, err
				},
				SharedLeases: mode.shared,
			}))
		})
	}
}
