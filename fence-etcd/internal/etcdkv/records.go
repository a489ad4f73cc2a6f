package etcdkv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// PartRecord is the value of a part key (and of a publication key): one
// part's current content.
//
// Content is a []byte, so encoding/json stores it as base64: the value is
// then at most 4/3 of the content whatever the content holds, and a write of
// backendkit.MaxContentLen bytes stays inside etcd's default request limit
// (1.5 MiB). As a JSON string it could grow sixfold (every control
// character becomes \u00XX) and a valid write would be refused as too
// large.
type PartRecord struct {
	Content []byte `json:"content"`
	Writer  string `json:"writer"`
	Token   uint64 `json:"token"`
	// WrittenAt is the writer's clock when it built the request: etcd
	// stores no time of its own. For display only.
	WrittenAt time.Time `json:"written_at"`
}

// NewPartRecord returns the record of w, stamped with the local clock.
func NewPartRecord(w leasecore.Write) PartRecord {
	return NewPartRecordAt(w, time.Now())
}

// NewPartRecordAt returns the record of w, stamped with at (the parts of a
// batch share one time).
func NewPartRecordAt(w leasecore.Write, at time.Time) PartRecord {
	return PartRecord{Content: []byte(w.Content), Writer: w.Writer, Token: uint64(w.Token), WrittenAt: at.UTC()}
}

// Encode returns the record as JSON, the bytes encoding/json writes for it.
func (p PartRecord) Encode() string {
	if p.Content != nil { // encoding/json writes null for nil content
		if s, ok := encodePart(string(p.Content), p.Writer, p.Token, p.WrittenAt); ok {
			return s
		}
	}
	return mustJSON(p)
}

// EncodePartRecord is NewPartRecordAt(w, at).Encode() without the copy of
// the content: every write encodes one.
func EncodePartRecord(w leasecore.Write, at time.Time) string {
	if s, ok := encodePart(w.Content, w.Writer, uint64(w.Token), at.UTC()); ok {
		return s
	}
	return NewPartRecordAt(w, at).Encode()
}

// encodePart writes a part record as encoding/json would encode it, with
// one allocation and without its reflection, when that is plain to write
// by hand: a writer of printable ASCII that JSON (with its HTML escaping)
// leaves as is, a UTC time of a four-digit year. ok is false otherwise,
// and the caller falls back to encoding/json; TestPartRecordEncoding
// checks that both agree.
func encodePart(content, writer string, token uint64, at time.Time) (_ string, ok bool) {
	if at.Location() != time.UTC || at.Year() < 0 || at.Year() > 9999 {
		return "", false
	}
	for i := 0; i < len(writer); i++ {
		if c := writer[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return "", false
		}
	}
	const (
		head = `{"content":"`
		mid  = `","writer":"`
		tok  = `","token":`
		tim  = `,"written_at":"`
		tail = `"}`
	)
	var b strings.Builder
	b.Grow(len(head) + base64.StdEncoding.EncodedLen(len(content)) + len(mid) + len(writer) + len(tok) + 20 +
		len(tim) + len(time.RFC3339Nano) + len(tail))
	b.WriteString(head)
	// base64 in pieces through stack buffers: the content is a string, and
	// a []byte of it would be a copy.
	var in [3 * 256]byte
	var out [4 * 256]byte
	for len(content) > 0 {
		n := copy(in[:], content)
		content = content[n:]
		base64.StdEncoding.Encode(out[:], in[:n]) // n is a multiple of 3 but for the last piece
		b.Write(out[:base64.StdEncoding.EncodedLen(n)])
	}
	b.WriteString(mid)
	b.WriteString(writer)
	b.WriteString(tok)
	b.Write(strconv.AppendUint(in[:0], token, 10))
	b.WriteString(tim)
	b.Write(at.AppendFormat(in[:0], time.RFC3339Nano))
	b.WriteString(tail)
	return b.String(), true
}

// StoredPart converts the record back.
func (p PartRecord) StoredPart(scope, part string) leasecore.StoredPart {
	return leasecore.StoredPart{Scope: scope, Part: part, Content: string(p.Content), Writer: p.Writer,
		Token: leasecore.Token(p.Token), WrittenAt: p.WrittenAt}
}

// DecodePart parses the value of a part key.
func DecodePart(key string, value []byte) (PartRecord, error) {
	var p PartRecord
	if err := json.Unmarshal(value, &p); err != nil {
		return PartRecord{}, fmt.Errorf("key %q does not hold a part record: %w", key, err)
	}
	return p, nil
}

// AttemptRecord is the value of an attempt key: one fence check, accepted
// or rejected. An accepted check's record is written in the same
// transaction as the write it records; a rejection's is written by a Put
// after the rejection is known (fenceetcd.Fence.Commit), or, by the negative
// controls, in the transaction that decided it.
//
// A check of the fence alone (fenceetcd.Fence.Advance, or Fence.Commit of
// the caller's own transaction) names no part: Part and Parts are empty. A
// write of the part store names its part in Part. A batch's record
// (fenceetcd.Resource.WriteBatch) names all its parts, in the batch's order,
// in Parts instead, and Part is empty: the batch is one attempt of all or
// none of its parts, and one key per batch keeps its transaction inside
// etcd's limit of operations per transaction (128 by default). Reader.Attempts
// expands such a record into one leasecore.Attempt per part, so readers see
// one entry per part, as on PostgreSQL. At most one of Part and Parts is
// set.
type AttemptRecord struct {
	Part     string   `json:"part,omitempty"`
	Parts    []string `json:"parts,omitempty"`
	Writer   string   `json:"writer"`
	Token    uint64   `json:"token"`
	Accepted bool     `json:"accepted"`
	// Floor is the scope's floor after the attempt: the token itself when
	// accepted, the larger floor that beat it when rejected. Every record
	// of fenceetcd's Fence and Resource carries it. It is omitted when the
	// writer could not know it, which only the negative controls do: an
	// etcd transaction cannot copy one key's value into another, and a
	// control logs its attempt in the transaction that decides it. Such an
	// attempt did not change the floor, so Reader.Attempts reports the floor
	// after the previous attempt of the scope.
	Floor uint64 `json:"floor,omitempty"`
	// At is the writer's clock when the attempt began; the attempt's key
	// carries the same time (Layout.NewAttempt). For display and for
	// bounding reads and prunes: it is not etcd's order of application.
	At time.Time `json:"at"`
}

// NewAttemptRecord returns the record of w's attempt, stamped with the local
// clock. floor is 0 when unknown (see AttemptRecord.Floor).
func NewAttemptRecord(w leasecore.Write, accepted bool, floor leasecore.Token) AttemptRecord {
	return NewAttemptRecordAt(w, accepted, floor, time.Now())
}

// NewAttemptRecordAt returns the record of w's attempt, stamped with at.
func NewAttemptRecordAt(w leasecore.Write, accepted bool, floor leasecore.Token, at time.Time) AttemptRecord {
	return AttemptRecord{Part: w.Part, Writer: w.Writer, Token: uint64(w.Token), Accepted: accepted,
		Floor: uint64(floor), At: at.UTC()}
}

// NewClaimAttemptRecord returns the record of a check of the fence alone:
// no part.
func NewClaimAttemptRecord(c leasecore.Claim, accepted bool, floor leasecore.Token, at time.Time) AttemptRecord {
	return AttemptRecord{Writer: c.Writer, Token: uint64(c.Token), Accepted: accepted, Floor: uint64(floor), At: at.UTC()}
}

// NewBatchAttemptRecord returns the record of batch b's attempt: one record
// for all its parts (see AttemptRecord), stamped with at.
func NewBatchAttemptRecord(b leasecore.Batch, accepted bool, floor leasecore.Token, at time.Time) AttemptRecord {
	parts := make([]string, len(b.Parts))
	for i, p := range b.Parts {
		parts[i] = p.Part
	}
	return AttemptRecord{Parts: parts, Writer: b.Writer, Token: uint64(b.Token), Accepted: accepted,
		Floor: uint64(floor), At: at.UTC()}
}

// Encode returns the record as JSON.
func (a AttemptRecord) Encode() string { return mustJSON(a) }

// PartNames returns the parts the record stands for: Part for a single
// write (empty for a check of the fence alone), Parts for a batch.
func (a AttemptRecord) PartNames() []string {
	if len(a.Parts) > 0 {
		return a.Parts
	}
	return []string{a.Part}
}

// DecodeAttempt parses the value of an attempt key. A record names at most
// one of part and parts.
func DecodeAttempt(key string, value []byte) (AttemptRecord, error) {
	var a AttemptRecord
	if err := json.Unmarshal(value, &a); err != nil {
		return AttemptRecord{}, fmt.Errorf("key %q does not hold an attempt record: %w", key, err)
	}
	if a.Part != "" && len(a.Parts) > 0 {
		return AttemptRecord{}, fmt.Errorf("key %q does not hold an attempt record: it names both part and parts", key)
	}
	return a, nil
}

// mustJSON marshals a record type of this file, which cannot fail: they
// hold only strings, numbers, booleans, byte slices and times from
// time.Now (years 0-9999).
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("etcdkv: marshal %T: %v", v, err))
	}
	return string(b)
}
