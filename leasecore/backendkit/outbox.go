package backendkit

import (
	"context"
	"fmt"

	"github.com/leasefence/leasefence/leasecore"
)

// MaxPayloadLen is the largest payload of one outbox entry, in bytes: the
// largest content of a write (MaxContentLen), so an entry fits in one etcd
// request next to its data.
const MaxPayloadLen = MaxContentLen

// CheckOutboxEntry validates what a writer puts into a fenced outbox (op
// names the caller): the claim (CheckClaim, which also checks ctx), the
// topic as a name (CheckName), and a payload of at most MaxPayloadLen bytes
// (any bytes; empty is allowed).
func CheckOutboxEntry(ctx context.Context, op string, c leasecore.Claim, topic string, payload []byte) error {
	if err := CheckName(op, "topic", topic); err != nil {
		return err
	}
	if len(payload) > MaxPayloadLen {
		return &leasecore.ArgError{Op: op, Field: "payload", Value: fmt.Sprintf("%d bytes", len(payload)),
			Reason: fmt.Sprintf("is larger than %d bytes", MaxPayloadLen)}
	}
	return CheckClaim(ctx, op, c)
}

// CheckRelay validates the arguments of an outbox relay: a deliver function
// and a live context.
func CheckRelay(ctx context.Context, op string, deliver func(context.Context, leasecore.OutboxEntry) error) error {
	if deliver == nil {
		return &leasecore.ArgError{Op: op, Field: "deliver", Reason: "must not be nil"}
	}
	return CheckContext(op, ctx)
}
