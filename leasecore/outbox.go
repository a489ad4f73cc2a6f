package leasecore

import "time"

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
