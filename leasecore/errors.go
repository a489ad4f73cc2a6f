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
	// a crash (fsync off). The wrapping error says what to change. A
	// retry loop (Campaign) returns it instead of retrying; a deployment
	// should meet it at start-up, from the backend's start-up check.
	ErrConfig = errors.New("leasecore: backend misconfigured")
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
