package conformance

import (
	"context"

	"github.com/leasefence/leasefence/leasecore"
)

// TxStatement runs one more statement in a write's open atomic operation:
// on PostgreSQL a statement on the transaction (a read of the row just
// written, say); on a backend whose atomic operation is one request (an
// etcd Txn), one more operation added to the request being built.
type TxStatement func(ctx context.Context) error

// InTransaction is the hook a UserResource's Write calls once inside its
// atomic operation, after the first user table's row and before the
// remaining rows and the commit (or, for a one-request backend, while it
// builds the request, before sending it), with stmt running one more
// statement of it. It runs whatever the case put in ctx — F18 freezes the
// holder process there with SIGSTOP, or keeps it busy running stmt every
// 100 ms past its lease — and returns nil at once otherwise. An error
// from it abandons the write: return it.
func InTransaction(ctx context.Context, w leasecore.Write, stmt TxStatement) error {
	hook, _ := ctx.Value(inTxKey{}).(inTxHook)
	if hook == nil {
		return nil
	}
	return hook(ctx, w, stmt)
}

// inTxHook is what a case runs inside a write (InTransaction).
type inTxHook func(ctx context.Context, w leasecore.Write, stmt TxStatement) error

type inTxKey struct{}

// withInTransaction returns a copy of ctx whose writes run hook inside
// their atomic operation (InTransaction), the way net/http/httptrace
// carries a trace.
func withInTransaction(ctx context.Context, hook inTxHook) context.Context {
	return context.WithValue(ctx, inTxKey{}, hook)
}
