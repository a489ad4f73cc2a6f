package leasecore

import (
	"context"
	"fmt"
	"time"
)

// OutboxEntry is one side effect recorded in a fenced outbox (fencepg.Outbox,
// fenceetcd.Outbox): written in the same atomic operation as the data it
// announces, under the fence's check of the writer's claim, so it exists
// only if that claim was accepted. A relay then delivers it to a downstream
// system that cannot check fences itself, carrying the claim's token as the
// entry's version.
//
// Delivery is at least once: a relay marks an entry delivered only after
// the downstream acknowledged it, so a relay that dies in between delivers
// it again, and two relays may both deliver it. The downstream stays correct
// with two rules of its own, which together rebuild the fence on its side:
//
//   - deduplicate by ID: an entry whose ID it has already processed is a
//     no-op, acknowledged again;
//   - per Scope, reject a Token below the largest it has accepted (and
//     acknowledge the rejection: the entry is superseded, not failed).
type OutboxEntry struct {
	// ID is the entry's identity: a random 128-bit value drawn when the
	// entry was written, unique across outboxes, never reused (also after
	// an outbox is restored from a backup), and the same on every delivery
	// of the entry. The downstream deduplicates by it.
	ID string
	// Seq is the entry's position in its outbox, the order in which a
	// relay delivers. Within one scope an entry written under a larger
	// token has a larger Seq than every entry of a smaller token (the
	// fence serialises them), so one relay never delivers a newer version
	// before an older one. Entries committed in one transaction may share
	// a Seq (etcd: it is the create revision).
	Seq int64
	// Scope, Writer and Token are the claim the entry was written under;
	// Token is the version the downstream compares.
	Scope  string
	Writer string
	Token  Token
	// Topic says what the entry announces, e.g. "report-published".
	Topic string
	// Payload is the message for the downstream, as the writer gave it.
	Payload []byte
	// At is when the entry was written: the database's clock on
	// PostgreSQL, the writer's on etcd.
	At time.Time
}

// MaxPayloadLen is the largest payload of one outbox entry, in bytes: the
// largest content of a write (MaxContentLen), so an entry fits in one etcd
// request next to its data.
const MaxPayloadLen = MaxContentLen

// CheckOutboxEntry validates what a writer puts into a fenced outbox (op
// names the caller): the claim (CheckClaim, which also checks ctx), the
// topic as a name (CheckName), and a payload of at most MaxPayloadLen bytes
// (any bytes; empty is allowed).
func CheckOutboxEntry(ctx context.Context, op string, c Claim, topic string, payload []byte) error {
	if err := CheckName(op, "topic", topic); err != nil {
		return err
	}
	if len(payload) > MaxPayloadLen {
		return &ArgError{Op: op, Field: "payload", Value: fmt.Sprintf("%d bytes", len(payload)),
			Reason: fmt.Sprintf("is larger than %d bytes", MaxPayloadLen)}
	}
	return CheckClaim(ctx, op, c)
}

// CheckRelay validates the arguments of an outbox relay: a deliver function
// and a live context.
func CheckRelay(ctx context.Context, op string, deliver func(context.Context, OutboxEntry) error) error {
	if deliver == nil {
		return &ArgError{Op: op, Field: "deliver", Reason: "must not be nil"}
	}
	return CheckContext(op, ctx)
}
