// Package etcdtest gives fence-etcd's tests a real etcd: one throwaway
// etcdtemp server per test binary, started on first use, a fresh key prefix
// per call, clients that close themselves, and a snapshot of everything
// under a prefix for "nothing changed" checks.
package etcdtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

var (
	once     sync.Once
	server   *etcdtemp.Server
	startErr error
)

// Main runs the tests, stops the server if one was started, then fails the
// binary if a goroutine was left behind (a client not closed). Call it from
// TestMain after the etcdtemp and holder hooks.
func Main(m *testing.M) {
	code := m.Run()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "etcdtest: stop server:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "etcdtest: goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Server returns the test binary's shared server, starting it on first
// use. A server that cannot start fails the test: a broken test
// environment, not a reason to skip.
func Server(tb testing.TB) *etcdtemp.Server {
	tb.Helper()
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		server, startErr = etcdtemp.Start(ctx)
	})
	if startErr != nil {
		tb.Fatal(startErr)
	}
	return server
}

// Client returns a new client of the shared server (its own connection),
// closed when the test ends.
func Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return Dial(tb, Server(tb).Endpoints())
}

// Dial returns a new client of endpoints, connected, closed when the test
// ends.
func Dial(tb testing.TB, endpoints []string) *clientv3.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := etcdconformance.Dial(ctx, endpoints)
	if err != nil {
		tb.Fatalf("dial %v: %v", endpoints, err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Prefix returns a fresh key prefix nothing else uses.
func Prefix() string { return etcdconformance.NewPrefix() }

// Snapshot returns every key under prefix with its value, create and mod
// revisions and lease, one per line in key order, for "nothing changed"
// checks.
func Snapshot(tb testing.TB, cli *clientv3.Client, prefix string) string {
	tb.Helper()
	resp, err := cli.Get(context.Background(), prefix+"/", clientv3.WithPrefix())
	if err != nil {
		tb.Fatalf("snapshot %s: %v", prefix, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d keys\n", len(resp.Kvs))
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s = %.120q (create %d, mod %d, lease %x)\n", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Lease)
	}
	return b.String()
}
