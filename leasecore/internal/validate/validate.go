// Package validate holds the input rules that leasecore applies to its own
// arguments (Session, SessionSet, Observe) and that backendkit exports to
// backends, in one place so the two cannot drift apart. It knows nothing of
// leasecore's types: a rule reports a *Problem, and its caller wraps it in
// a *leasecore.ArgError with the operation's name.
package validate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits that leasecore itself enforces; backendkit exports them.
const (
	MaxNameLen    = 200
	MaxTTL        = 24 * time.Hour
	MaxAcquireAll = 1000
)

// Problem is one bad input: the field, its value as Quote shows it (empty
// when there is nothing to show), and what is wrong with it.
type Problem struct {
	Field, Value, Reason string
}

// Context returns an error wrapping ctx.Err() when ctx is already done,
// and the context's cause as well when it has one of its own (a session's
// context ends with ErrLocalDeadline or ErrLost: a caller that passes it
// must be able to tell why, with errors.Is, as from every other error of
// an ended context).
func Context(op string, ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("leasecore: %s: ctx: %w (the context ended: %w)", op, err, cause)
	}
	return fmt.Errorf("leasecore: %s: ctx: %w", op, err)
}

// Name is backendkit.CheckName's rule for an identifier.
func Name(field, v string) *Problem {
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
	bad := func(reason string) *Problem {
		return &Problem{Field: field, Value: Quote(v), Reason: reason}
	}
	switch {
	case v == "":
		return &Problem{Field: field, Reason: "must not be empty"}
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

// TTL is backendkit.CheckTTL's rule.
func TTL(ttl, minTTL time.Duration) *Problem {
	bad := func(reason string) *Problem {
		return &Problem{Field: "ttl", Value: ttl.String(), Reason: reason}
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

// AcquireAll is backendkit.CheckAcquireAll's rule, without the context.
func AcquireAll(names []string, holder string, ttl, minTTL time.Duration) *Problem {
	if len(names) == 0 || len(names) > MaxAcquireAll {
		return &Problem{Field: "names", Value: fmt.Sprint(len(names)),
			Reason: fmt.Sprintf("must hold 1 to %d names", MaxAcquireAll)}
	}
	seen := make(map[string]int, len(names))
	for i, n := range names {
		field := fmt.Sprintf("names[%d]", i)
		if p := Name(field, n); p != nil {
			return p
		}
		if j, dup := seen[n]; dup {
			return &Problem{Field: field, Value: Quote(n), Reason: fmt.Sprintf("repeats names[%d]", j)}
		}
		seen[n] = i
	}
	if p := Name("holder", holder); p != nil {
		return p
	}
	return TTL(ttl, minTTL)
}

// Quote is backendkit.Quote: v quoted, shortened to 40 runes. It looks at
// no more than the first 41 runes: v may be an over-long input that is
// being rejected for its size.
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
