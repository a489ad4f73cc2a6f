package etcdkv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// DefaultPrefix is the key prefix of a store without fenceetcd.WithPrefix.
const DefaultPrefix = "/leasefence"

// Layout names every key fence-etcd writes under one prefix:
//
//	<prefix>/lease/<name>                  value: holder; attached to the etcd lease
//	<prefix>/floor/<scope>                 value: the scope's floor, EncodeToken
//	<prefix>/floorspace/<scope>            value: EncodeFloorSpace (the token space of the token
//	                                       that last raised the floor, and that token)
//	<prefix>/part/<scope>/<part>           value: PartRecord (JSON)
//	<prefix>/attempt/<scope>/<20-digit unix ns>-<8 hex>
//	                                       value: AttemptRecord (JSON)
//	<prefix>/moved/<scope>                 value: SealRecord (JSON), when the scope moved away
//	<prefix>/parttoken/<scope>/<part>      value: EncodeToken (etcdcontrol's row fence only)
//	<prefix>/published/<scope>/<part>      value: PartRecord (etcdcontrol's publisher only)
//	<prefix>/holdergen/<holder>/<16 hex>   value: empty; attached to the holder's shared etcd lease
//	                                       whose ID it names (HolderGen): the holder's generation key
//	<prefix>/queue/<name>/<16 hex>-<8 hex> value: holder; attached to the etcd lease the waiter's hold
//	                                       will be attached to, whose ID it names (QueueEntry): one
//	                                       caller waiting in line for the lease (fenceetcd's AcquireQueued)
//
// Every name, scope and part is escaped with url.PathEscape, so a "/" in a
// name is "%2F" in its key: one key never lies inside another's range (scope
// "a" and scope "a/b" have disjoint attempt ranges), and "%" itself is
// escaped, so two names never share a key.
type Layout struct {
	prefix string
}

// NewLayout validates opts (the prefix, see CheckPrefix, and the attempt
// log mode; op names the caller in the error) and returns the prefix's
// layout.
func NewLayout(op string, opts Options) (Layout, error) {
	if err := CheckPrefix(op, opts.Prefix); err != nil {
		return Layout{}, err
	}
	if err := backendkit.CheckAttemptLog(op, opts.AttemptLog); err != nil {
		return Layout{}, err
	}
	return Layout{prefix: opts.Prefix}, nil
}

// CheckPrefix validates a key prefix: an identifier as backendkit.CheckName
// defines it (non-empty, at most backendkit.MaxNameLen bytes of valid UTF-8,
// no control characters, no surrounding whitespace) that begins with "/"
// and does not end with "/" (the layout adds the separator).
func CheckPrefix(op, prefix string) error {
	if err := backendkit.CheckName(op, "prefix", prefix); err != nil {
		return err
	}
	bad := func(reason string) error {
		return &leasecore.ArgError{Op: op, Field: "prefix", Value: `"` + prefix + `"`, Reason: reason}
	}
	switch {
	case !strings.HasPrefix(prefix, "/"):
		return bad(`must begin with "/"`)
	case strings.HasSuffix(prefix, "/"):
		return bad(`must not end with "/" (the key layout adds it)`)
	}
	return nil
}

// Prefix returns the layout's prefix.
func (l Layout) Prefix() string { return l.prefix }

// Lease is the key of lease name.
func (l Layout) Lease(name string) string { return l.key("lease", name) }

// Floor is the key of scope's floor.
func (l Layout) Floor(scope string) string { return l.key("floor", scope) }

// FloorSpace is the key of the token space of scope's floor: a key of its
// own rather than part of the floor's value, because Fence.Guard compares
// the floor's whole value with the encoded token (an etcd compare has no
// prefix match), and floors written by earlier versions, and the readers of
// those versions, keep working unchanged.
func (l Layout) FloorSpace(scope string) string { return l.key("floorspace", scope) }

// Part is the key of one part's content.
func (l Layout) Part(scope, part string) string { return l.key("part", scope, part) }

// AttemptPrefix is the prefix of scope's attempt keys, "/" included.
func (l Layout) AttemptPrefix(scope string) string { return l.key("attempt", scope) + "/" }

// NewAttempt returns a fresh attempt key of scope for an attempt made at
// at: the time as 20-digit zero-padded Unix nanoseconds, so that byte order
// is time order and a range of keys is a span of time (AttemptsAt), then 32
// random bits, so writers never coordinate and two attempts of one
// nanosecond still get two keys. The time is the writer's clock.
func (l Layout) NewAttempt(scope string, at time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return l.AttemptsAt(scope, at) + "-" + hex.EncodeToString(b[:])
}

// AttemptsAt is the first key of scope's attempt log that can hold an
// attempt made at t or later: the bound of a read from t on, or of a prune
// of everything before t. A t before 1970 is 1970 (no attempt is older);
// the encoding holds times up to the year 2262 (time.Time.UnixNano).
func (l Layout) AttemptsAt(scope string, t time.Time) string {
	ns := int64(0)
	if t.After(time.Unix(0, 0)) {
		ns = t.UnixNano()
	}
	return fmt.Sprintf("%s%0*d", l.AttemptPrefix(scope), tokenDigits, ns)
}

// Fenced are the prefixes of the keys a fence owns, floors, their token
// spaces, attempt logs and seal records: a caller's transaction run under
// the fence must not write there (fenceetcd.Fence.Commit refuses it).
func (l Layout) Fenced() []string {
	return []string{l.prefix + "/floor/", l.prefix + "/floorspace/", l.prefix + "/attempt/", l.prefix + "/moved/"}
}

// HolderGen is the generation key of holder's shared etcd lease id
// (fenceetcd.WithSharedLeases): the lease ID as 16 lower-case hex digits
// under HolderGenPrefix(holder). It is put attached to that lease, so it
// goes with it. Whoever removes a lease key of holder's (a release, a
// take-over) in the same transaction deletes or rewrites it, so that an
// unchanged mod revision of this key means that none of holder's lease keys
// attached to the lease was removed in between (see fenceetcd's RenewAll).
func (l Layout) HolderGen(holder string, id int64) string {
	// Not with fmt: RenewAll's fast path and every shared Release or
	// AcquireAll that rewrites it build it per call.
	digits := strconv.FormatUint(uint64(id), 16)
	return l.HolderGenPrefix(holder) + strings.Repeat("0", 16-len(digits)) + digits
}

// HolderGenPrefix is the prefix of every generation key of holder, "/"
// included: a delete of this prefix ends what every store verified about
// holder's names.
func (l Layout) HolderGenPrefix(holder string) string { return l.key("holdergen", holder) + "/" }

// QueuePrefix is the prefix of lease name's waiting line, "/" included:
// the entries sorted by create revision are the line, first come first.
func (l Layout) QueuePrefix(name string) string { return l.key("queue", name) + "/" }

// NewQueueEntry returns a fresh key in lease name's waiting line for a
// waiter whose hold will be attached to etcd lease id: the ID as 16 hex
// digits, then 32 random bits, so two waiters on one shared etcd lease
// still get two keys.
func (l Layout) NewQueueEntry(name string, id int64) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	digits := strconv.FormatUint(uint64(id), 16)
	return l.QueuePrefix(name) + strings.Repeat("0", 16-len(digits)) + digits + "-" + hex.EncodeToString(b[:])
}

// PartToken is the key of the row-fenced control's per-part token.
func (l Layout) PartToken(scope, part string) string { return l.key("parttoken", scope, part) }

// Published is the key of the idempotent publisher's publication.
func (l Layout) Published(scope, part string) string { return l.key("published", scope, part) }

func (l Layout) key(kind string, names ...string) string {
	var b strings.Builder
	// One allocation when no name needs escaping (PathEscape then returns
	// the name itself): every fenced request builds two or three keys.
	n := len(l.prefix) + 1 + len(kind)
	for _, name := range names {
		n += 1 + len(name)
	}
	b.Grow(n)
	b.WriteString(l.prefix)
	b.WriteString("/")
	b.WriteString(kind)
	for _, n := range names {
		b.WriteString("/")
		b.WriteString(url.PathEscape(n))
	}
	return b.String()
}
