package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// mapSentinels are the errors MapError's table speaks of.
var mapSentinels = []error{leasecore.ErrUnavailable, leasecore.ErrLost, leasecore.ErrInvalidArgument,
	leasecore.ErrConfig, context.Canceled, context.DeadlineExceeded}

// checkMapped fails unless got, MapError's result for err, has the
// caller's prefix, wraps err and want (nil: no sentinel err does not
// already wrap) and no other sentinel.
func checkMapped(t *testing.T, got, err, want error) {
	t.Helper()
	if !strings.HasPrefix(got.Error(), "mybackend: renew: ") {
		t.Errorf("message %q lacks the caller's prefix", got)
	}
	if !errors.Is(got, err) {
		t.Errorf("%v does not wrap the client's error %v", got, err)
	}
	if want != nil && !errors.Is(got, want) {
		t.Errorf("%v does not wrap %v", got, want)
	}
	for _, s := range mapSentinels {
		if s != want && !errors.Is(err, s) && errors.Is(got, s) {
			t.Errorf("%v wraps %v too", got, s)
		}
	}
}

// TestMapErrorTable: the exported mapping follows its documented table,
// both forms of each etcd error, and agrees with the mapping fenceetcd
// uses itself on every row (the same sentinels), so a backend that uses it
// reports errors as fenceetcd does.
func TestMapErrorTable(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(live)
	cancel2()

	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // nil: no sentinel
	}{
		{"context canceled kept", live, fmt.Errorf("x: %w", context.Canceled), context.Canceled},
		{"context deadline kept", live, context.DeadlineExceeded, context.DeadlineExceeded},
		{"gRPC canceled, ctx cancelled", cancelled, status.Error(codes.Canceled, "context canceled"), context.Canceled},
		{"gRPC deadline, ctx expired", expired, status.Error(codes.DeadlineExceeded, "deadline"), context.DeadlineExceeded},
		{"no leader after ctx ended", cancelled, rpctypes.ErrNoLeader, context.Canceled},
		{"permission denied after ctx ended", cancelled, rpctypes.ErrPermissionDenied, context.Canceled},
		{"lease not found", live, rpctypes.ErrLeaseNotFound, leasecore.ErrLost},
		{"gRPC lease not found", live, rpctypes.ErrGRPCLeaseNotFound, leasecore.ErrLost},
		{"request too large", live, rpctypes.ErrRequestTooLarge, leasecore.ErrInvalidArgument},
		{"gRPC too many operations", live, rpctypes.ErrGRPCTooManyOps, leasecore.ErrInvalidArgument},
		{"duplicate key", live, rpctypes.ErrDuplicateKey, leasecore.ErrInvalidArgument},
		{"empty key", live, rpctypes.ErrEmptyKey, leasecore.ErrInvalidArgument},
		{"key not found", live, rpctypes.ErrKeyNotFound, leasecore.ErrInvalidArgument},
		{"client send limit", live, status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (3 vs. 2)"), leasecore.ErrInvalidArgument},
		{"user name empty", live, rpctypes.ErrUserEmpty, leasecore.ErrConfig},
		{"authentication failed", live, rpctypes.ErrGRPCAuthFailed, leasecore.ErrConfig},
		{"permission denied", live, rpctypes.ErrPermissionDenied, leasecore.ErrConfig},
		{"gRPC permission denied", live, rpctypes.ErrGRPCPermissionDenied, leasecore.ErrConfig},
		{"no leader", live, rpctypes.ErrNoLeader, leasecore.ErrUnavailable},
		{"leader changed", live, rpctypes.ErrLeaderChanged, leasecore.ErrUnavailable},
		{"request timed out", live, rpctypes.ErrTimeout, leasecore.ErrUnavailable},
		{"too many requests", live, rpctypes.ErrTooManyRequests, leasecore.ErrUnavailable},
		{"no space", live, rpctypes.ErrNoSpace, leasecore.ErrUnavailable},
		{"gRPC unavailable", live, status.Error(codes.Unavailable, "connection refused"), leasecore.ErrUnavailable},
		{"wrapped gRPC unavailable", live, fmt.Errorf("x: %w", status.Error(codes.Unavailable, "eof")), leasecore.ErrUnavailable},
		{"server deadline, ctx live", live, status.Error(codes.DeadlineExceeded, "deadline"), leasecore.ErrUnavailable},
		{"gRPC canceled, ctx live", live, status.Error(codes.Canceled, "grpc: the client connection is closing"), nil},
		{"compacted", live, rpctypes.ErrCompacted, nil},
		{"other", live, errors.New("boom"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fenceetcd.MapError(tc.ctx, "mybackend", "renew", tc.err)
			checkMapped(t, got, tc.err, tc.want)
			own := etcdkv.MapError(tc.ctx, "mybackend", "renew", tc.err)
			for _, s := range mapSentinels {
				if errors.Is(got, s) != errors.Is(own, s) {
					t.Errorf("exported %v and fenceetcd's own %v disagree on %v", got, own, s)
				}
			}
		})
	}
	if fenceetcd.MapError(live, "mybackend", "renew", nil) != nil {
		t.Error("MapError(nil) != nil")
	}
	// The permission hint speaks of the caller's keys, not fenceetcd's
	// prefix option.
	if msg := fenceetcd.MapError(live, "mybackend", "renew", rpctypes.ErrGRPCPermissionDenied).Error(); strings.Contains(msg, "WithPrefix") ||
		!strings.Contains(msg, "etcdctl role grant-permission") {
		t.Errorf("permission denied: %q, want the etcdctl grant without fenceetcd's WithPrefix", msg)
	}
}

// TestMapErrorFromServer: errors a real etcd and its client return, as a
// backend of its own meets them, map as documented.
func TestMapErrorFromServer(t *testing.T) {
	cli := etcdtest.Client(t)
	ctx := context.Background()

	t.Run("keep-alive of a revoked lease", func(t *testing.T) {
		lease, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Revoke(ctx, lease.ID); err != nil {
			t.Fatal(err)
		}
		_, err = cli.KeepAliveOnce(ctx, lease.ID)
		checkMapped(t, fenceetcd.MapError(ctx, "mybackend", "renew", err), err, leasecore.ErrLost)
	})

	t.Run("request too large", func(t *testing.T) {
		_, err := cli.Put(ctx, etcdtest.Prefix()+"/big", strings.Repeat("x", 1600*1024))
		checkMapped(t, fenceetcd.MapError(ctx, "mybackend", "renew", err), err, leasecore.ErrInvalidArgument)
	})

	t.Run("unreachable server, ctx deadline", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		dead, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer dead.Close()
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err = dead.Get(dctx, "/x")
		checkMapped(t, fenceetcd.MapError(dctx, "mybackend", "renew", err), err, context.DeadlineExceeded)
	})

	t.Run("client closed under the call", func(t *testing.T) {
		closed := etcdtest.Dial(t, cli.Endpoints())
		closed.Close()
		_, err := closed.Get(ctx, "/x")
		if err == nil {
			t.Fatal("Get on a closed client succeeded")
		}
		// Not retryable, not a lost hold: the caller closed its own client.
		checkMapped(t, fenceetcd.MapError(ctx, "mybackend", "renew", err), err, nil)
	})
}
