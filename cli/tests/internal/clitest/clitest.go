// Package clitest gives the leasefence command's tests real servers: one
// throwaway PostgreSQL cluster (pgtemp) and one etcd server (etcdtemp) per
// test binary, each started on first use and stopped by Main, with fresh
// databases and key prefixes per test.
package clitest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

var (
	pgOnce    sync.Once
	cluster   *pgtemp.Cluster
	pgErr     error
	etcdOnce  sync.Once
	server    *etcdtemp.Server
	etcdErr   error
	dbSeq     atomic.Int64
	startTime = 2 * time.Minute
)

// Main is TestMain: the etcd server's process when etcdtemp re-executes
// the test binary to run one, the tests otherwise; it stops whatever
// servers the tests started.
func Main(m *testing.M) {
	if etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "clitest: stop cluster:", err)
			code = 1
		}
	}
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "clitest: stop etcd:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Cluster returns the binary's PostgreSQL cluster, started on first use.
// A cluster that cannot start fails the test: a broken environment, not a
// reason to skip.
func Cluster(tb testing.TB) *pgtemp.Cluster {
	tb.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTime)
		defer cancel()
		cluster, pgErr = pgtemp.Start(ctx)
	})
	if pgErr != nil {
		tb.Fatal(pgErr)
	}
	return cluster
}

// CreateDB creates an empty database and returns its DSN.
func CreateDB(tb testing.TB, prefix string) string {
	tb.Helper()
	c := Cluster(tb)
	name := fmt.Sprintf("%s_%d", prefix, dbSeq.Add(1))
	if err := c.CreateDatabase(context.Background(), name); err != nil {
		tb.Fatal(err)
	}
	return c.DSN(name)
}

// Etcd returns the binary's etcd server, started on first use.
func Etcd(tb testing.TB) *etcdtemp.Server {
	tb.Helper()
	etcdOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTime)
		defer cancel()
		server, etcdErr = etcdtemp.Start(ctx)
	})
	if etcdErr != nil {
		tb.Fatal(etcdErr)
	}
	return server
}

// NewPrefix returns a key prefix nothing else uses.
func NewPrefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "/leasefence-cli-test/" + hex.EncodeToString(b[:])
}
