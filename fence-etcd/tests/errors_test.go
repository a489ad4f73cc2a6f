package fenceetcd_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// TestErrorsFromServer: errors a real etcd returns are mapped as
// documented (the table of client error values is in internal/etcdkv).
func TestErrorsFromServer(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	t.Run("request too large", func(t *testing.T) {
		// Above the server's default limit (1.5 MiB), below the client's
		// send limit (2 MiB): the server refuses it.
		_, err := f.cli.Put(ctx, f.prefix+"/big", strings.Repeat("x", 1600*1024))
		got := etcdkv.MapError(ctx, "fenceetcd", "write", err)
		if !errors.Is(got, leasecore.ErrInvalidArgument) || !strings.Contains(got.Error(), "request is too large") {
			t.Fatalf("got %v, want ErrInvalidArgument for a request too large", got)
		}
		// Above the client's send limit: refused before it is sent.
		_, err = f.cli.Put(ctx, f.prefix+"/big", strings.Repeat("x", 3<<20))
		if got := etcdkv.MapError(ctx, "fenceetcd", "write", err); !errors.Is(got, leasecore.ErrInvalidArgument) {
			t.Fatalf("got %v, want ErrInvalidArgument for a message above the client's limit", got)
		}
	})

	t.Run("unreachable server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		leases, err := fenceetcd.NewLeaseStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		// The client waits for a connection until the deadline.
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err = leases.Acquire(dctx, "report-job", "holder-a", time.Minute)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "fenceetcd: acquire: ") {
			t.Fatalf("got %v, want a context deadline error from fenceetcd", err)
		}
	})

	t.Run("renew of a lease revoked behind the store's back", func(t *testing.T) {
		g, err := f.leases.Acquire(ctx, "revoked", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := f.cli.Get(ctx, f.layout(t).Lease("revoked"))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatal(resp, err)
		}
		if _, err := f.cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
			t.Fatal(err)
		}
		_, err = f.leases.Renew(ctx, g)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "no such lease (expired or released)")
	})
}
