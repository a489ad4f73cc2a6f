package backendkit

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/internal/validate"
)

// Limits shared by every backend. Backends may declare stricter ones (a
// larger minimum TTL), never looser ones.
const (
	// MaxNameLen is the longest lease name, holder, scope, part or writer,
	// in bytes.
	MaxNameLen = 200
	// MaxContentLen is the largest content of one write, in bytes. It
	// stays below etcd's default request limit (1.5 MiB) so every backend
	// can store it in one atomic operation.
	MaxContentLen = 1 << 20
	// MaxTTL is the longest lease TTL. A lease is a liveness tool; a TTL
	// above a day is almost certainly a unit mistake.
	MaxTTL = 24 * time.Hour
)

// MaxToken is the largest token any backend issues or accepts. Tokens live
// in signed 64-bit columns (PostgreSQL bigint, etcd revisions), whose
// largest value, leasecore.SealedFloor, is reserved for the floor of a
// sealed scope: MaxToken is one less, so that every claim is below a sealed
// floor.
const MaxToken leasecore.Token = leasecore.SealedFloor - 1

// arg wraps a shared rule's problem in the *leasecore.ArgError of op; no
// problem is a nil error.
func arg(op string, p *validate.Problem) error {
	if p == nil {
		return nil
	}
	return &leasecore.ArgError{Op: op, Field: p.Field, Value: p.Value, Reason: p.Reason}
}

// CheckContext returns an error wrapping ctx.Err() when ctx is already done,
// so an operation fails before it sends or writes anything. It wraps the
// context's cause too (context.Cause) when that is an error of its own,
// such as a session's ErrLocalDeadline or ErrLost.
func CheckContext(op string, ctx context.Context) error {
	return validate.Context(op, ctx)
}

// CheckName validates an identifier: a lease name, holder, scope, part or
// writer. It must be non-empty, at most MaxNameLen bytes of valid UTF-8,
// without control characters (NUL included: PostgreSQL text cannot store
// it), and without leading or trailing whitespace (" holder-a" and
// "holder-a" would be two holders that look the same in every log).
// Anything else, SQL-looking text included, is stored verbatim.
func CheckName(op, field, v string) error {
	return arg(op, validate.Name(field, v))
}

// CheckTTL validates a TTL against the shared bounds and the backend's
// minimum.
func CheckTTL(op string, ttl, minTTL time.Duration) error {
	return arg(op, validate.TTL(ttl, minTTL))
}

// CheckToken validates a token: 1..MaxToken. leasecore.SealedFloor, one
// above MaxToken, is refused too: it is the floor of a sealed scope, and a
// claim with it would pass that floor.
func CheckToken(op string, t leasecore.Token) error {
	switch {
	case t == 0:
		return &leasecore.ArgError{Op: op, Field: "token", Value: "0", Reason: "must be positive (0 is never issued)"}
	case t > MaxToken:
		return &leasecore.ArgError{Op: op, Field: "token", Value: t.String(),
			Reason: fmt.Sprintf("is above the largest token %d (%d is reserved: the floor of a sealed scope)", MaxToken, leasecore.SealedFloor)}
	}
	return nil
}

// CheckSpace validates a token space (Grant.Space, Claim.Space): empty
// (unknown), or an identifier by CheckName's rules — at most MaxNameLen
// bytes of valid UTF-8, no control characters (NUL included), no
// surrounding whitespace — since a fence stores it next to the floor.
func CheckSpace(op, space string) error {
	if space == "" {
		return nil
	}
	return CheckName(op, "space", space)
}

// CheckAcquire validates the arguments of Lease.Acquire.
func CheckAcquire(ctx context.Context, name, holder string, ttl, minTTL time.Duration) error {
	if err := CheckName("acquire", "name", name); err != nil {
		return err
	}
	if err := CheckName("acquire", "holder", holder); err != nil {
		return err
	}
	if err := CheckTTL("acquire", ttl, minTTL); err != nil {
		return err
	}
	return CheckContext("acquire", ctx)
}

// CheckInspect validates the arguments of LeaseInspector.Inspect.
func CheckInspect(ctx context.Context, name string) error {
	if err := CheckName("inspect", "name", name); err != nil {
		return err
	}
	return CheckContext("inspect", ctx)
}

// CheckGrant validates a grant passed to Renew or Release (op).
func CheckGrant(ctx context.Context, op string, g leasecore.Grant, minTTL time.Duration) error {
	if err := CheckName(op, "name", g.Name); err != nil {
		return err
	}
	if err := CheckName(op, "holder", g.Holder); err != nil {
		return err
	}
	if err := CheckToken(op, g.Token); err != nil {
		return err
	}
	if err := CheckTTL(op, g.TTL, minTTL); err != nil {
		return err
	}
	if err := CheckSpace(op, g.Space); err != nil {
		return err
	}
	return CheckContext(op, ctx)
}

// CheckWrite validates a fenced write: scope, part and writer as names, a
// non-zero token, a valid space (CheckSpace). Content may be empty; it must be
// valid UTF-8 without NUL bytes and at most MaxContentLen bytes.
func CheckWrite(ctx context.Context, w leasecore.Write) error {
	const op = "write"
	for _, f := range []struct{ field, v string }{
		{"scope", w.Scope}, {"part", w.Part}, {"writer", w.Writer},
	} {
		if err := CheckName(op, f.field, f.v); err != nil {
			return err
		}
	}
	if err := CheckToken(op, w.Token); err != nil {
		return err
	}
	if err := CheckSpace(op, w.Space); err != nil {
		return err
	}
	if err := CheckContent(op, w.Content); err != nil {
		return err
	}
	return CheckContext(op, ctx)
}

// CheckContent validates the content of a write.
func CheckContent(op, content string) error { return checkContent(op, "content", content) }

func checkContent(op, field, content string) error {
	bad := func(reason string) error {
		return &leasecore.ArgError{Op: op, Field: field, Value: Quote(content), Reason: reason}
	}
	switch {
	case len(content) > MaxContentLen:
		return bad(fmt.Sprintf("is %d bytes, larger than %d", len(content), MaxContentLen))
	case !utf8.ValidString(content):
		return bad("is not valid UTF-8")
	case strings.IndexByte(content, 0) >= 0:
		return bad("contains a NUL byte")
	}
	return nil
}

// Quote returns v quoted for an error message, shortened to 40 runes, as
// leasecore.ArgError and leasecore.HoldError show values; a backend's own
// messages and checks (the conformance suite's) use it to show values the
// same way. It looks at no more than the first 41 runes: v may be an
// over-long input that is being rejected for its size.
func Quote(v string) string { return validate.Quote(v) }
