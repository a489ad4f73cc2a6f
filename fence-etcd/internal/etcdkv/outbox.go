package etcdkv

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// The fenced outbox (fenceetcd.Outbox): one key per pending entry,
//
//	<prefix>/outbox/<scope>/<20-digit ns>-<id>   value: OutboxRecord
//
// scope escaped with url.PathEscape like every name of the layout, ns a
// strictly increasing number of this process (its clock's Unix
// nanoseconds, moved on by one where the clock did not advance), so the
// entries one writer builds for one Txn keep their order, id the entry's
// random identity (leasecore.OutboxEntry.ID). A relay deletes the key once
// the downstream acknowledged the entry. The entries' order is their keys'
// create revision, which etcd gives a key when the transaction that puts
// it is applied, then the key.

// OutboxPrefix is the prefix of every outbox key, "/" included.
func (l Layout) OutboxPrefix() string { return l.prefix + "/outbox/" }

// OutboxKey is the key of rec's entry.
func (l Layout) OutboxKey(rec OutboxRecord) string {
	return fmt.Sprintf("%s%s/%0*d-%s", l.OutboxPrefix(), url.PathEscape(rec.Scope), tokenDigits, rec.seq, rec.ID)
}

// lastOutboxSeq is the last key number NewOutboxRecord handed out.
var lastOutboxSeq atomic.Int64

// nextOutboxSeq returns the clock's Unix nanoseconds, or one more than the
// last number returned when the clock did not advance (or went back).
func nextOutboxSeq() int64 {
	for {
		last, now := lastOutboxSeq.Load(), time.Now().UnixNano()
		next := max(now, last+1)
		if lastOutboxSeq.CompareAndSwap(last, next) {
			return next
		}
	}
}

// NewOutboxID returns a fresh entry identity: 128 random bits written as a
// version-4 UUID, the form PostgreSQL's gen_random_uuid gives fencepg's.
func NewOutboxID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// OutboxRecord is the value of an outbox key, apart from the payload: the
// value is this record as one line of JSON, a newline, then the payload's
// bytes as they are (no base64: an entry of backendkit.MaxPayloadLen bytes
// stays well inside etcd's request limit next to its data).
type OutboxRecord struct {
	ID     string `json:"id"`
	Scope  string `json:"scope"`
	Writer string `json:"writer"`
	Token  uint64 `json:"token"`
	Topic  string `json:"topic"`
	// At is the writer's clock when it built the entry: etcd stores no time
	// of its own.
	At time.Time `json:"at"`

	seq int64 // the key's number
}

// NewOutboxRecord returns the record of an entry of claim c with a fresh
// ID, stamped with the local clock.
func NewOutboxRecord(c leasecore.Claim, topic string) OutboxRecord {
	return OutboxRecord{ID: NewOutboxID(), Scope: c.Scope, Writer: c.Writer, Token: uint64(c.Token), Topic: topic,
		At: time.Now().UTC(), seq: nextOutboxSeq()}
}

// Encode returns the key's value: the record's JSON line and the payload.
func (r OutboxRecord) Encode(payload []byte) string {
	return mustJSON(r) + "\n" + string(payload)
}

// DecodeOutbox parses an outbox key's value into an entry whose Seq is
// createRevision.
func DecodeOutbox(key string, value []byte, createRevision int64) (leasecore.OutboxEntry, error) {
	head, payload, ok := bytes.Cut(value, []byte("\n"))
	var r OutboxRecord
	if !ok {
		return leasecore.OutboxEntry{}, fmt.Errorf("key %q does not hold an outbox record: no newline", key)
	}
	if err := json.Unmarshal(head, &r); err != nil {
		return leasecore.OutboxEntry{}, fmt.Errorf("key %q does not hold an outbox record: %w", key, err)
	}
	return leasecore.OutboxEntry{ID: r.ID, Seq: createRevision, Scope: r.Scope, Writer: r.Writer,
		Token: leasecore.Token(r.Token), Topic: r.Topic, Payload: bytes.Clone(payload), At: r.At}, nil
}
