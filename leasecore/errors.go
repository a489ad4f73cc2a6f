package leasecore

import (
	"errors"
	"fmt"
)

// Sentinel errors. Backends and Session wrap them with context; match them
// with errors.Is, never by comparing messages. Callers may wrap them further.
var (
	// ErrInvalidArgument: the input was rejected before anything was
	// sent or written. The wrapping error (an *ArgError) names the field.
	ErrInvalidArgument = errors.New("leasecore: invalid argument")

	// ErrHeld: Acquire found an unexpired holding period. This is the
	// normal outcome for every instance but one, not a failure of the
	// system.
	ErrHeld = errors.New("leasecore: lease held by another holder")

	// ErrLost: the holding period a Grant names is over (expired, released
	// or taken over), so Renew or Release could not act on it. The holder
	// must stop, drop its intermediate results and acquire again.
	ErrLost = errors.New("leasecore: lease hold lost")

	// ErrLocalDeadline: a Session's local deadline passed before a
	// renewal succeeded. The server may still count the lease as held for
	// up to the margin, but the holder must stop starting new work.
	ErrLocalDeadline = errors.New("leasecore: local deadline passed")

	// ErrClosed: the Session was closed by its owner.
	ErrClosed = errors.New("leasecore: session closed")

	// ErrUnavailable: the backend could not be reached or refused service
	// for a reason that may pass (connection lost, server shutting down).
	// The operation may or may not have taken effect.
	ErrUnavailable = errors.New("leasecore: backend unavailable")

	// ErrSchema: the backend's schema is missing or out of date; run its
	// migration.
	ErrSchema = errors.New("leasecore: backend schema missing")

	// ErrConfig: the backend is misconfigured; retrying will not help
	// until the configuration is fixed. Examples: an unknown database or
	// role, an authentication failure, a missing privilege (the wrapping
	// error names the grant), a connection pooler that breaks the driver's
	// prepared statements, a server that does not keep its writes across
	// a crash (fsync off), a fence's floor in a state that only a write
	// outside the fence or lost committed transactions leave (a floor
	// below a token the fence raised it to, the sealed floor without its
	// seal record, a value that is not a token). The wrapping error says
	// what to change. A retry loop (Campaign) returns it instead of
	// retrying; a deployment should meet it at start-up, from the
	// backend's start-up check.
	ErrConfig = errors.New("leasecore: backend misconfigured")

	// ErrTokenSpace: a fence rejected a claim because the scope's floor
	// was set by a token from another lease service — another token space
	// (Grant.Space, Claim.Space). The rule: a scope is fenced by exactly
	// one lease service. Tokens are comparable only within one lease name
	// of one service: etcd revisions in the millions and PostgreSQL tokens
	// 1, 2, ... say nothing about each other, so a scope moved from one
	// service to the other rejects every write of the service with the
	// smaller tokens, forever, as if each were stale. Fences report it
	// only where they know both spaces (the claim's Space and the space
	// stored with the floor when it was raised), as a *TokenSpaceError
	// that also wraps ErrConfig: retrying does not help until the scope is
	// fenced by one service again. A stale token of the floor's own space
	// is an ordinary rejection, without an error.
	ErrTokenSpace = errors.New("leasecore: token from another lease service")

	// ErrScopeMoved: a fence rejected a claim because the scope was moved
	// away from this location: its data and floor now live at another
	// database or cluster, and this location's floor is SealedFloor, which
	// rejects every write (see ScopeSeal). The rejected Result comes with
	// a *ScopeMovedError naming the destination, so a stale holder, or
	// one whose routing is stale, learns where the scope went. Retrying
	// here never helps; writing there is judged by the floor that moved
	// with the data. Sealing a scope again for another destination is
	// refused with it too.
	ErrScopeMoved = errors.New("leasecore: scope moved to another location")
)

// ArgError describes one bad input. It wraps ErrInvalidArgument.
type ArgError struct {
	Op     string // "acquire", "write", "new session", ...
	Field  string // "name", "holder", "ttl", "token", ...
	Value  string // the offending value, quoted and shortened for display
	Reason string
}

func (e *ArgError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("leasecore: %s: invalid %s: %s", e.Op, e.Field, e.Reason)
	}
	return fmt.Sprintf("leasecore: %s: invalid %s %s: %s", e.Op, e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidArgument.
func (e *ArgError) Unwrap() error { return ErrInvalidArgument }

// HoldError says why a lease operation did not take effect. It wraps
// ErrHeld or ErrLost.
type HoldError struct {
	Op     string // "acquire", "renew", "release"
	Name   string
	Holder string
	Token  Token  // the token the caller presented; 0 for acquire
	Reason string // e.g. "expired", "released", "taken over by holder-b (token 2)"
	Err    error  // ErrHeld or ErrLost
}

func (e *HoldError) Error() string {
	s := fmt.Sprintf("%s: %s %q by %q", e.Err, e.Op, e.Name, e.Holder)
	if e.Token != 0 {
		s += fmt.Sprintf(" with token %d", e.Token)
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Unwrap returns ErrHeld or ErrLost.
func (e *HoldError) Unwrap() error { return e.Err }

// TokenSpaceError is a fence's rejection of a claim by a floor that a token
// of another token space set (see ErrTokenSpace). The fence's Result says
// rejected as for any stale token; this error, returned with it, says that
// the claim is not stale but from the wrong lease service. It wraps
// ErrTokenSpace and ErrConfig.
type TokenSpaceError struct {
	Op    string // "check", "run tx", "write", ...
	Scope string
	Token Token  // the claim's token
	Space string // the claim's token space
	// Floor is the scope's floor whose space is FloorSpace, as read after
	// the rejection: the floor that rejected Token, or a larger one that
	// raised it since.
	Floor      Token
	FloorSpace string
}

func (e *TokenSpaceError) Error() string {
	return fmt.Sprintf("%s: %s scope %q: token %d from token space %q is below floor %d, which a token from token space %q set: "+
		"a scope is fenced by exactly one lease service (tokens of two services cannot be compared; "+
		"fence the scope with one lease service again, or reset its floor deliberately)",
		ErrTokenSpace, e.Op, e.Scope, e.Token, e.Space, e.Floor, e.FloorSpace)
}

// Unwrap returns ErrTokenSpace and ErrConfig.
func (e *TokenSpaceError) Unwrap() []error { return []error{ErrTokenSpace, ErrConfig} }
