package leasecore

import (
	"errors"
	"fmt"
	"time"
)

// SessionEventKind says what happened to a Session.
type SessionEventKind int

const (
	// SessionAcquired: NewSession acquired the lease (Grant, Deadline,
	// Latency: the acquire's round trip).
	SessionAcquired SessionEventKind = iota + 1
	// SessionAcquireFailed: NewSession's acquire failed (Err: wrapping
	// ErrHeld when another holder has the lease, ErrLocalDeadline when the
	// acquire took longer than ttl - margin and the grant was given back,
	// else the backend's error). Grant names the lease and the holder only
	// (plus the unusable grant for ErrLocalDeadline). Options NewSession
	// refuses before any acquire are not reported.
	SessionAcquireFailed
	// SessionRenewed: a background renewal succeeded (Grant, Deadline: the
	// new local deadline, Latency, Late).
	SessionRenewed
	// SessionRenewFailed: a background renewal attempt failed (Err) and
	// Deadline still stands; unless Err wraps ErrLost, the next attempt
	// follows at the next tick, and a SessionEnded follows at the
	// deadline if none succeeds.
	SessionRenewFailed
	// SessionEnded: the session ended (Err wraps ErrLost, ErrLocalDeadline
	// or ErrClosed, as Session.Err). For ErrClosed it is sent once Close
	// has released the lease, and Err also carries the release's error if
	// it failed. Sent once per session; a session that ended by a loss
	// sends nothing more on Close.
	SessionEnded
)

var sessionEventNames = [...]string{"", "acquired", "acquire failed", "renewed", "renew failed", "ended"}

func (k SessionEventKind) String() string {
	if k > 0 && int(k) < len(sessionEventNames) {
		return sessionEventNames[k]
	}
	return fmt.Sprintf("SessionEventKind(%d)", int(k))
}

// SessionEvent reports one step of a Session's life to the observers set
// with WithSessionObserver (and to WithLogger's logger).
type SessionEvent struct {
	Kind SessionEventKind
	// Grant is the grant acquired or renewed; for the other kinds the
	// session's grant when it happened. Name and Holder are always set.
	Grant Grant
	// Deadline is the local deadline in force after the event (by the
	// session's clock; compare it with that clock only); zero for
	// SessionAcquireFailed and SessionEnded.
	Deadline time.Time
	// Latency is the request's round trip by the session's clock, from the
	// reading before it was sent until its answer (or until a timed-out
	// attempt gave up): acquires and renewals only.
	Latency time.Duration
	// Late (SessionRenewed) reports that the renewal kept the lease later
	// than the renew interval plans: attempts failed since the last
	// success, or the renewal itself took longer than the renew interval.
	// The session came that much closer to its local deadline.
	Late bool
	Err  error
}

// WithSessionObserver adds a function called with every SessionEvent of the
// session (Session, and each session a Campaign acquires through
// WithSessionOptions; SessionSet reports none). Each call adds one; they
// run in the order given. A nil f is ignored.
//
// Observers run synchronously: the acquire's on NewSession's goroutine, the
// rest on the renewal goroutine or Close's. They must not block (the next
// renewal waits for them) and must not call Close (Close waits for the
// renewal goroutine). Done closes before the SessionEnded report, so
// ending work is never delayed by an observer; once Close returns, every
// event of the session has been reported. Without an observer nothing is
// built or called.
func WithSessionObserver(f func(SessionEvent)) SessionOption {
	return func(c *sessionConfig) { c.observe = chain(c.observe, f) }
}

// chain returns a function calling a then b; either may be nil.
func chain[E any](a, b func(E)) func(E) {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(e E) { a(e); b(e) }
}

// acquireFailed reports a failed acquire of NewSession: g names the lease
// (and, for an unusable grant, is that grant); start is the clock reading
// before the request.
func (c *sessionConfig) acquireFailed(g Grant, start time.Time, err error) {
	if c.observe != nil {
		c.observe(SessionEvent{Kind: SessionAcquireFailed, Grant: g, Latency: c.clock.Now().Sub(start), Err: err})
	}
}

// emitEnded reports the end of the session under g.
func (s *Session) emitEnded(g Grant, err error) {
	if s.observe != nil {
		s.observe(SessionEvent{Kind: SessionEnded, Grant: g, Err: err})
	}
}

// emitRenew reports one renewal attempt answered after took: renewed (err
// nil, g and deadline the new ones) or failed (g and deadline the ones
// still in force). failed counts the attempts that failed since the last
// success.
func (s *Session) emitRenew(g Grant, deadline time.Time, took time.Duration, failed int, err error) {
	ev := SessionEvent{Kind: SessionRenewed, Grant: g, Deadline: deadline, Latency: took, Err: err}
	if err != nil {
		ev.Kind = SessionRenewFailed
	} else {
		ev.Late = failed > 0 || took > s.interval
	}
	s.observe(ev)
}

// closedErr is the Err of the SessionEnded event Close sends: ErrClosed,
// and the release's error when it failed.
func closedErr(releaseErr error) error {
	if releaseErr == nil {
		return ErrClosed
	}
	return errors.Join(ErrClosed, releaseErr)
}
