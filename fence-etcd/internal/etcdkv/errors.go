package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/leasecore"
)

// MapError is the one place where etcd client, server and gRPC errors
// become fence-etcd errors. pkg and op name the caller ("fenceetcd",
// "acquire"); the result reads "<pkg>: <op>: ..." and always wraps err, so
// the client's error stays reachable with errors.Is and errors.As.
//
//   - Context errors are kept. An error while ctx is done, and a gRPC
//     Canceled or DeadlineExceeded status (which the client reports when
//     it gave up on ctx), wrap ctx.Err(), so callers match the context
//     whatever the client made of it, and the cause of its end when it
//     has one of its own (a session's context ends with
//     leasecore.ErrLocalDeadline or leasecore.ErrLost).
//   - rpctypes.ErrLeaseNotFound wraps leasecore.ErrLost: the etcd lease
//     behind a hold is gone, so the hold is over. Callers for whom it means
//     something else (an acquire whose fresh lease expired before its key
//     was written) check for it before calling MapError.
//   - "request is too large" (rpctypes.ErrRequestTooLarge, or the client's
//     own "larger than max" send limit) wraps leasecore.ErrInvalidArgument:
//     the same request will never fit. So do the refusals of a malformed
//     transaction, which only a caller's own operations can cause
//     (fenceetcd.Fence.Commit): too many operations (the server's
//     --max-txn-ops), a key put twice or put and deleted in one branch, an
//     empty key, an empty operation. etcd refuses such a request before
//     applying any of it.
//   - Authentication and RBAC refusals wrap leasecore.ErrConfig: retrying
//     will not help until the configuration is fixed. "user name is empty"
//     (rpctypes.ErrUserEmpty: authentication is on and the client sent no
//     user), "authentication failed" (rpctypes.ErrAuthFailed: a wrong user
//     or password in clientv3.Config) and "permission denied"
//     (rpctypes.ErrPermissionDenied: the user's roles lack read or write
//     on the store's keys; the message gives the etcdctl grant).
//   - gRPC code Unavailable (no leader, leader changed, server stopped,
//     request timed out, unhealthy cluster, connection refused or lost),
//     ResourceExhausted (too many requests, database space exceeded) and
//     DeadlineExceeded from the server while ctx is still live wrap
//     leasecore.ErrUnavailable: the condition may pass.
//
// Everything else is wrapped as it is, a Canceled status while ctx is live
// included (the client was closed under the call). For ErrUnavailable and for context
// errors the operation may or may not have taken effect: a transaction may
// have been applied before the answer was lost.
func MapError(ctx context.Context, pkg, op string, err error) error {
	if err == nil {
		return nil
	}
	prefix := pkg + ": " + op
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return withCause(ctx, fmt.Errorf("%s: %w", prefix, err))
	case ctx.Err() != nil:
		return withCause(ctx, fmt.Errorf("%s: %w: %w", prefix, ctx.Err(), err))
	case errors.Is(err, rpctypes.ErrLeaseNotFound), errors.Is(err, rpctypes.ErrGRPCLeaseNotFound):
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrLost, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), errors.Is(err, rpctypes.ErrGRPCRequestTooLarge),
		errors.Is(err, rpctypes.ErrTooManyOps), errors.Is(err, rpctypes.ErrGRPCTooManyOps),
		errors.Is(err, rpctypes.ErrDuplicateKey), errors.Is(err, rpctypes.ErrGRPCDuplicateKey),
		errors.Is(err, rpctypes.ErrEmptyKey), errors.Is(err, rpctypes.ErrGRPCEmptyKey),
		errors.Is(err, rpctypes.ErrKeyNotFound), errors.Is(err, rpctypes.ErrGRPCKeyNotFound):
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrInvalidArgument, err)
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrGRPCUserEmpty):
		return fmt.Errorf("%s: %w (etcd has authentication enabled and the client sent no user: "+
			"set Username and Password in clientv3.Config): %w", prefix, leasecore.ErrConfig, err)
	case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrGRPCAuthFailed):
		return fmt.Errorf("%s: %w (authentication failed: check Username and Password in clientv3.Config, "+
			"and the user on the etcd cluster): %w", prefix, leasecore.ErrConfig, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrGRPCPermissionDenied):
		return fmt.Errorf("%s: %w (permission denied: grant a role of this user read and write on the store's "+
			"key prefix (WithPrefix, /leasefence by default): etcdctl role grant-permission <role> --prefix=true "+
			"readwrite <prefix>/): %w", prefix, leasecore.ErrConfig, err)
	}
	code, msg := grpcCode(err)
	switch code {
	case codes.ResourceExhausted:
		if strings.Contains(msg, "larger than max") {
			// gRPC's own message size limit (client or server side).
			return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrInvalidArgument, err)
		}
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// grpcCode returns the gRPC code and message of err: an rpctypes.EtcdError
// (the client converts the server's known errors into those) or a gRPC
// status error, wrapped or not. Anything else is codes.Unknown.
func grpcCode(err error) (codes.Code, string) {
	var etcdErr rpctypes.EtcdError
	if errors.As(err, &etcdErr) {
		return etcdErr.Code(), etcdErr.Error()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code(), s.Message()
	}
	return codes.Unknown, err.Error()
}

// withCause adds the cause of ctx's end to err, when ctx ended with one
// of its own (context.WithCancelCause), so that the caller reads, and can
// match, why the context ended, not only that it did.
func withCause(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if cause == nil || cause == ctx.Err() || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (the context ended: %w)", err, cause)
}
