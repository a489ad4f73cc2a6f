package etcdkv

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"

	"github.com/leasefence/leasefence/leasecore"
)

// DefaultPrefix is the key prefix of a store without fenceetcd.WithPrefix.
const DefaultPrefix = "/leasefence"

// Options are the settings a fenceetcd.Option changes. The zero value is
// not ready for use: start from NewOptions.
type Options struct {
	Prefix string
	// SharedLeases is fenceetcd.WithSharedLeases: only NewLeaseStore reads
	// it.
	SharedLeases bool
}

// NewOptions returns the defaults.
func NewOptions() Options { return Options{Prefix: DefaultPrefix} }

// Layout names every key fence-etcd writes under one prefix:
//
//	<prefix>/lease/<name>                  value: holder; attached to the etcd lease
//	<prefix>/floor/<scope>                 value: the scope's floor, EncodeToken
//	<prefix>/part/<scope>/<part>           value: PartRecord (JSON)
//	<prefix>/attempt/<scope>/<16 hex>      value: AttemptRecord (JSON)
//	<prefix>/parttoken/<scope>/<part>      value: EncodeToken (etcdcontrol's row fence only)
//	<prefix>/published/<scope>/<part>      value: PartRecord (etcdcontrol's publisher only)
//
// Every name, scope and part is escaped with url.PathEscape, so a "/" in a
// name is "%2F" in its key: one key never lies inside another's range (scope
// "a" and scope "a/b" have disjoint attempt ranges), and "%" itself is
// escaped, so two names never share a key.
type Layout struct {
	prefix string
}

// NewLayout validates opts.Prefix (see CheckPrefix; op names the caller in
// the error) and returns its layout.
func NewLayout(op string, opts Options) (Layout, error) {
	if err := CheckPrefix(op, opts.Prefix); err != nil {
		return Layout{}, err
	}
	return Layout{prefix: opts.Prefix}, nil
}

// CheckPrefix validates a key prefix: an identifier as leasecore.CheckName
// defines it (non-empty, at most leasecore.MaxNameLen bytes of valid UTF-8,
// no control characters, no surrounding whitespace) that begins with "/"
// and does not end with "/" (the layout adds the separator).
func CheckPrefix(op, prefix string) error {
	if err := leasecore.CheckName(op, "prefix", prefix); err != nil {
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

// Part is the key of one part's content.
func (l Layout) Part(scope, part string) string { return l.key("part", scope, part) }

// AttemptPrefix is the prefix of scope's attempt keys, "/" included.
func (l Layout) AttemptPrefix(scope string) string { return l.key("attempt", scope) + "/" }

// NewAttempt returns a fresh attempt key of scope: 64 random bits, so
// writers never coordinate. The write log is ordered by the keys'
// revisions, not by their names.
func (l Layout) NewAttempt(scope string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return l.AttemptPrefix(scope) + hex.EncodeToString(b[:])
}

// PartToken is the key of the row-fenced control's per-part token.
func (l Layout) PartToken(scope, part string) string { return l.key("parttoken", scope, part) }

// Published is the key of the idempotent publisher's publication.
func (l Layout) Published(scope, part string) string { return l.key("published", scope, part) }

func (l Layout) key(kind string, names ...string) string {
	var b strings.Builder
	b.WriteString(l.prefix)
	b.WriteString("/")
	b.WriteString(kind)
	for _, n := range names {
		b.WriteString("/")
		b.WriteString(url.PathEscape(n))
	}
	return b.String()
}
