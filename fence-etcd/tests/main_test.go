package fenceetcd_test

import (
	"context"
	"os"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestMain doubles as the etcd server (etcdtemp re-executes this test
// binary to run one) and as the holder process of F4 and F5 (the
// conformance harness re-executes it with etcdconformance.HolderEnv set).
func TestMain(m *testing.M) {
	if etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	if etcdconformance.IsHolderProcess() {
		os.Exit(etcdconformance.HolderMain())
	}
	etcdtest.Main(m)
}

// logAll makes a resource or fence log every attempt, as the conformance
// harness does: most tests read the whole log.
var logAll = fenceetcd.WithAttemptLog(leasecore.LogAll)

// fixture is a fresh key prefix on the shared server, a client, and every
// store on them; res logs every attempt (logAll).
type fixture struct {
	cli      *clientv3.Client
	prefix   string
	leases   *fenceetcd.LeaseStore
	res      *fenceetcd.Resource
	controls *etcdcontrol.Controls
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{cli: etcdtest.Client(t), prefix: etcdtest.Prefix()}
	opt := fenceetcd.WithPrefix(f.prefix)
	var err error
	if f.leases, err = fenceetcd.NewLeaseStore(f.cli, opt); err != nil {
		t.Fatal(err)
	}
	if f.res, err = fenceetcd.NewResource(f.cli, opt, logAll); err != nil {
		t.Fatal(err)
	}
	if f.controls, err = etcdcontrol.New(f.cli, opt); err != nil {
		t.Fatal(err)
	}
	return f
}

// snapshot returns everything under the fixture's prefix.
func (f *fixture) snapshot(t *testing.T) string {
	t.Helper()
	return etcdtest.Snapshot(t, f.cli, f.prefix)
}

// get returns the key's value and mod revision (for a lease key: its
// token); ok false when absent.
func (f *fixture) get(t *testing.T, key string) (value string, modRev int64, ok bool) {
	t.Helper()
	resp, err := f.cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision, true
}
