package fenceetcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// MapError maps an error of the etcd client (go.etcd.io/etcd/client/v3)
// to leasecore's sentinels, the way fenceetcd maps its own. It is exported
// for authors of other leasecore backends on etcd (a lease built on
// concurrency.Session, say), whose errors must wrap the same sentinels for
// leasecore.Session, leasecore.Campaign and the conformance suite to treat
// them right: those retry only ErrUnavailable, stop on ErrLost, ErrConfig
// and ErrInvalidArgument, and report anything else as it is.
//
// pkg and op name the caller; the message reads "<pkg>: <op>: ...". The
// result always wraps err, so the client's error stays reachable with
// errors.Is and errors.As. nil maps to nil. In order:
//
//	condition                                                 wraps
//	err is context.Canceled or DeadlineExceeded               err as it is
//	ctx is done (whatever the client made of it)              ctx.Err()
//	rpctypes.ErrLeaseNotFound (the etcd lease is gone)        leasecore.ErrLost
//	request too large, too many operations in a Txn,
//	  a duplicate or empty key, an empty operation,
//	  gRPC ResourceExhausted "larger than max"                leasecore.ErrInvalidArgument
//	ErrUserEmpty, ErrAuthFailed, ErrPermissionDenied          leasecore.ErrConfig
//	gRPC Unavailable (no leader, leader changed, stopped,
//	  timed out, unhealthy, connection refused or lost),
//	  ResourceExhausted (too many requests, no space),
//	  DeadlineExceeded from the server while ctx is live      leasecore.ErrUnavailable
//	anything else (gRPC Canceled while ctx is live: the
//	  client was closed under the call; ErrCompacted; ...)    nothing: err as it is
//
// The rpctypes errors match in both forms, the client's (ErrLeaseNotFound)
// and the server's status (ErrGRPCLeaseNotFound). Two cases are the
// caller's to decide before calling MapError: ErrLeaseNotFound means the
// hold is over only where the etcd lease carried a hold (an acquire whose
// fresh lease expired before its key was written is not a lost hold), and
// for ErrUnavailable and context errors the request may or may not have
// taken effect — a Txn may have been applied before its answer was lost,
// so a caller that retries must make the retry safe (compare the key's
// mod revision, the token, not just its name).
func MapError(ctx context.Context, pkg, op string, err error) error {
	// fenceetcd's own message for a permission refusal names its key
	// prefix (WithPrefix); another backend's keys are its own.
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		(errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrGRPCPermissionDenied)) {
		return fmt.Errorf("%s: %s: %w (permission denied: grant a role of this user read and write on the keys "+
			"the client uses: etcdctl role grant-permission <role> --prefix=true readwrite <prefix>/): %w",
			pkg, op, leasecore.ErrConfig, err)
	}
	return etcdkv.MapError(ctx, pkg, op, err)
}
