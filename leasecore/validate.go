package leasecore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
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

// CheckContext returns an error wrapping ctx.Err() when ctx is already done,
// so an operation fails before it sends or writes anything.
func CheckContext(op string, ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("leasecore: %s: ctx: %w", op, err)
	}
	return nil
}

// CheckName validates an identifier: a lease name, holder, scope, part or
// writer. It must be non-empty, at most MaxNameLen bytes of valid UTF-8,
// without control characters (NUL included: PostgreSQL text cannot store
// it), and without leading or trailing whitespace (" holder-a" and
// "holder-a" would be two holders that look the same in every log).
// Anything else, SQL-looking text included, is stored verbatim.
func CheckName(op, field, v string) error {
	// The common case, printable ASCII, in one pass over the bytes: it
	// decides every rule at once (the only ASCII whitespace that is not a
	// control character is ' '). RenewAll checks two names per grant,
	// thousands per second in a busy process.
	if n := len(v); n > 0 && n <= MaxNameLen && v[0] != ' ' && v[n-1] != ' ' {
		i := 0
		for i < n && v[i] >= 0x20 && v[i] < 0x7f {
			i++
		}
		if i == n {
			return nil
		}
	}
	bad := func(reason string) error {
		return &ArgError{Op: op, Field: field, Value: Quote(v), Reason: reason}
	}
	switch {
	case v == "":
		return &ArgError{Op: op, Field: field, Reason: "must not be empty"}
	case len(v) > MaxNameLen:
		return bad(fmt.Sprintf("is %d bytes, longer than %d", len(v), MaxNameLen))
	case !utf8.ValidString(v):
		return bad("is not valid UTF-8")
	case strings.TrimSpace(v) == "":
		return bad("must not be only whitespace")
	case strings.TrimSpace(v) != v:
		return bad("must not begin or end with whitespace")
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return bad(fmt.Sprintf("contains control character %U", r))
		}
	}
	return nil
}

// CheckTTL validates a TTL against the shared bounds and the backend's
// minimum.
func CheckTTL(op string, ttl, minTTL time.Duration) error {
	bad := func(reason string) error {
		return &ArgError{Op: op, Field: "ttl", Value: ttl.String(), Reason: reason}
	}
	switch {
	case ttl <= 0:
		return bad("must be positive")
	case ttl < minTTL:
		return bad(fmt.Sprintf("is below this backend's minimum %v", minTTL))
	case ttl > MaxTTL:
		return bad(fmt.Sprintf("is above the maximum %v", MaxTTL))
	}
	return nil
}

// CheckToken validates a token: 1..MaxToken. SealedFloor, one above
// MaxToken, is refused too: it is the floor of a sealed scope, and a claim
// with it would pass that floor.
func CheckToken(op string, t Token) error {
	switch {
	case t == 0:
		return &ArgError{Op: op, Field: "token", Value: "0", Reason: "must be positive (0 is never issued)"}
	case t > MaxToken:
		return &ArgError{Op: op, Field: "token", Value: t.String(),
			Reason: fmt.Sprintf("is above the largest token %d (%d is reserved: the floor of a sealed scope)", MaxToken, SealedFloor)}
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
func CheckGrant(ctx context.Context, op string, g Grant, minTTL time.Duration) error {
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
func CheckWrite(ctx context.Context, w Write) error {
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
		return &ArgError{Op: op, Field: field, Value: Quote(content), Reason: reason}
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
// ArgError and HoldError show values; a backend's own messages and checks
// (the conformance suite's) use it to show values the same way. It
// looks at no more than the first 41 runes: v may be an over-long input
// that is being rejected for its size.
func Quote(v string) string {
	const max = 40
	n := 0
	for i := range v {
		if n == max {
			return strconv.Quote(v[:i]) + "..."
		}
		n++
	}
	return strconv.Quote(v)
}
