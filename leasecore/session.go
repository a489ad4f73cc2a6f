package leasecore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Session holds one lease for one continuous holding period: it acquires,
// renews in the background every interval, and tracks a local deadline.
//
// Every write under the session must carry Token(): the token, checked by
// the resource, is what makes the write safe. Valid and Done only help the
// holder stop early and waste less work; they cannot make a write safe,
// because a pause can fall between the check and the write.
//
// The local deadline is the Session clock's reading taken before the
// acquire (or last successful renew) request was sent, plus TTL - margin.
// Only the backend's clock decides expiry; the session never compares its
// clock with a server time. A failed renewal is only discovered at the next
// renewal, so the margin must cover the renew round trip and any clock-rate
// difference.
//
// A Session ends, closing Done, when a renewal finds the hold lost
// (ErrLost), when the local deadline passes without a successful renewal
// (ErrLocalDeadline), or when Close is called (ErrClosed). An ended session
// never revives: acquire a new one, which gets a new token. Close must be
// called in every case; it stops the renewal goroutine.
type Session struct {
	lease    Lease
	clock    Clock
	margin   time.Duration
	interval time.Duration
	onRenew  func(RenewEvent)

	mu       sync.Mutex
	grant    Grant
	deadline time.Time
	err      error // why the session ended; nil while it runs

	done       chan struct{} // closed when the session ends
	loopCtx    context.Context
	cancelLoop context.CancelFunc
	loopDone   chan struct{} // closed when the renewal goroutine has returned

	closeOnce sync.Once
	closeErr  error
}

// RenewEvent reports one background renewal to an observer set with
// WithRenewObserver.
type RenewEvent struct {
	Start    time.Time // clock reading before the renew request was sent
	Grant    Grant     // the renewed grant; zero when Err != nil
	Deadline time.Time // the new local deadline; zero when Err != nil
	Err      error
}

// SessionOption configures NewSession.
type SessionOption func(*sessionConfig)

type sessionConfig struct {
	ttl, interval, margin  time.Duration
	intervalSet, marginSet bool
	clock                  Clock
	onRenew                func(RenewEvent)
}

// DefaultSessionTTL is the TTL of a Session without WithTTL.
const DefaultSessionTTL = 15 * time.Second

// WithTTL sets the lease TTL (default DefaultSessionTTL).
func WithTTL(ttl time.Duration) SessionOption {
	return func(c *sessionConfig) { c.ttl = ttl }
}

// WithRenewInterval sets how often the session renews (default TTL/4). It
// must be shorter than TTL - margin.
func WithRenewInterval(d time.Duration) SessionOption {
	return func(c *sessionConfig) { c.interval, c.intervalSet = d, true }
}

// WithMargin sets the local safety margin (default TTL/5): the local
// deadline is that much earlier than the earliest possible server expiry.
func WithMargin(d time.Duration) SessionOption {
	return func(c *sessionConfig) { c.margin, c.marginSet = d, true }
}

// WithClock sets the local clock (default SystemClock).
func WithClock(clock Clock) SessionOption {
	return func(c *sessionConfig) { c.clock = clock }
}

// WithRenewObserver sets a function called after each background renewal,
// successful or not, from the renewal goroutine. It must not block, and
// must not call Close (Close waits for the renewal goroutine).
func WithRenewObserver(f func(RenewEvent)) SessionOption {
	return func(c *sessionConfig) { c.onRenew = f }
}

// newSessionConfig applies opts over the defaults and validates the result
// for op.
func newSessionConfig(op string, lease Lease, opts []SessionOption) (sessionConfig, error) {
	cfg := sessionConfig{ttl: DefaultSessionTTL, clock: SystemClock}
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.intervalSet {
		cfg.interval = cfg.ttl / 4
	}
	if !cfg.marginSet {
		cfg.margin = cfg.ttl / 5
	}
	return cfg, cfg.check(op, lease)
}

func (c *sessionConfig) check(op string, lease Lease) error {
	bad := func(field string, v time.Duration, reason string) error {
		return &ArgError{Op: op, Field: field, Value: v.String(), Reason: reason}
	}
	switch {
	case lease == nil:
		return &ArgError{Op: op, Field: "lease", Reason: "must not be nil"}
	case c.clock == nil:
		return &ArgError{Op: op, Field: "clock", Reason: "must not be nil"}
	}
	if err := CheckTTL(op, c.ttl, 0); err != nil {
		return err
	}
	switch {
	case c.margin < 0:
		return bad("margin", c.margin, "must not be negative")
	case c.margin >= c.ttl:
		return bad("margin", c.margin, fmt.Sprintf("must be shorter than the ttl %v", c.ttl))
	case c.interval <= 0:
		return bad("renew interval", c.interval, "must be positive")
	case c.interval >= c.ttl-c.margin:
		return bad("renew interval", c.interval, fmt.Sprintf(
			"must be shorter than ttl - margin (%v), or the local deadline passes before the first renewal",
			c.ttl-c.margin))
	}
	return nil
}

// NewSession acquires the lease name for holder and starts renewing it in
// the background. When another holder has the lease it returns an error
// wrapping ErrHeld; it does not wait. On any error nothing keeps running.
func NewSession(ctx context.Context, lease Lease, name, holder string, opts ...SessionOption) (*Session, error) {
	cfg, err := newSessionConfig("new session", lease, opts)
	if err != nil {
		return nil, err
	}

	// Read the clock before the request: the server starts the TTL only
	// after it received the request, so a deadline from this earlier
	// reading can only be earlier than the server's expiry.
	start, realStart := cfg.clock.Now(), time.Now()
	g, err := lease.Acquire(ctx, name, holder, cfg.ttl)
	if err != nil {
		return nil, err
	}
	g.Start = earliestStart(start, realStart, g)
	deadline := g.LocalDeadline(cfg.margin)
	if !cfg.clock.Now().Before(deadline) {
		// The acquire took longer than ttl - margin: the grant is unusable.
		// Give it back so nobody waits for it to expire.
		_ = lease.Release(context.WithoutCancel(ctx), g)
		return nil, fmt.Errorf("leasecore: new session %q: acquire took longer than ttl - margin (%v): %w",
			name, cfg.ttl-cfg.margin, ErrLocalDeadline)
	}

	loopCtx, cancel := context.WithCancel(context.Background())
	s := &Session{
		lease:      lease,
		clock:      cfg.clock,
		margin:     cfg.margin,
		interval:   cfg.interval,
		onRenew:    cfg.onRenew,
		grant:      g,
		deadline:   deadline,
		done:       make(chan struct{}),
		loopCtx:    loopCtx,
		cancelLoop: cancel,
		loopDone:   make(chan struct{}),
	}
	go s.renewLoop()
	return s, nil
}

// Token returns the session's fencing token. It never changes during a
// session. Every write under the session must carry it.
func (s *Session) Token() Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grant.Token
}

// Grant returns the current grant (its Start moves with each renewal).
func (s *Session) Grant() Grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grant
}

// Deadline returns the current local deadline.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Valid reports whether the session is running and its local deadline has
// not passed. A true answer is stale as soon as it is returned: use it to
// stop early, and rely on the token check for safety.
func (s *Session) Valid() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err == nil && s.clock.Now().Before(s.deadline)
}

// Done returns a channel that is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns nil while the session runs, and afterwards why it ended: an
// error wrapping ErrLost, ErrLocalDeadline or ErrClosed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops renewal and releases the lease unless the hold is already
// known lost. It waits for the renewal goroutine to return. A release that
// finds the hold already over is not an error. Close is idempotent; later
// calls return the first call's result. When the release fails (ctx done,
// backend unreachable) the lease stays held until its TTL runs out; the
// token is still never reused, so nothing unsafe follows.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.cancelLoop()
		<-s.loopDone
		s.mu.Lock()
		prior, g := s.err, s.grant
		s.mu.Unlock()
		s.end(ErrClosed)
		if errors.Is(prior, ErrLost) {
			return // nothing left to release
		}
		// Also after the local deadline: the server may still hold the
		// lease for up to the margin, and releasing frees it at once.
		if err := s.lease.Release(ctx, g); err != nil && !errors.Is(err, ErrLost) {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// end records why the session ended, once, and closes Done.
func (s *Session) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.err = err
	close(s.done)
}

func (s *Session) renewLoop() {
	defer close(s.loopDone)
	s.mu.Lock()
	g, deadline := s.grant, s.deadline
	s.mu.Unlock()
	// One timer per deadline, alive across the wait and the request, so the
	// session ends on time by its own clock even while a renewal hangs.
	expire := s.clock.NewTimer(deadline.Sub(s.clock.Now()))
	defer func() { expire.Stop() }()

	type reply struct {
		g   Grant
		err error
	}
	for {
		tick := s.clock.NewTimer(s.interval)
		select {
		case <-s.loopCtx.Done():
			tick.Stop()
			return
		case <-expire.C():
			tick.Stop()
			s.endDeadline(g)
			return
		case <-tick.C():
		}

		start, realStart := s.clock.Now(), time.Now() // before the request, as in NewSession
		if !start.Before(deadline) {
			s.endDeadline(g)
			return
		}
		ctx, cancel := context.WithCancel(s.loopCtx)
		replies := make(chan reply, 1)
		go func() {
			r, err := s.lease.Renew(ctx, g)
			replies <- reply{r, err}
		}()
		var rep reply
		select {
		case rep = <-replies:
			cancel()
		case <-expire.C():
			// A renewal that answers now is useless: the owner must be told
			// to stop at the deadline, not when the request gives up.
			s.endDeadline(g)
			cancel()
			<-replies
			return
		case <-s.loopCtx.Done():
			cancel()
			<-replies
			return // Close is waiting
		}
		if rep.err == nil && !s.clock.Now().Before(deadline) {
			// Answered just as the deadline passed: the session does not
			// come back to life once Valid may have reported false.
			s.endDeadline(g)
			return
		}
		ev := RenewEvent{Start: start, Err: rep.err}
		if rep.err == nil {
			g = rep.g
			g.Start = earliestStart(start, realStart, g)
			deadline = g.LocalDeadline(s.margin)
			ev.Grant, ev.Deadline = g, deadline
			s.mu.Lock()
			s.grant, s.deadline = g, deadline
			s.mu.Unlock()
			expire.Stop()
			expire = s.clock.NewTimer(deadline.Sub(s.clock.Now()))
		}
		if s.onRenew != nil {
			s.onRenew(ev)
		}
		if errors.Is(rep.err, ErrLost) {
			s.end(rep.err)
			return
		}
		// Any other error (connection lost, timeout) may pass: try again at
		// the next tick. The deadline timer ends the session if no renewal
		// succeeds in time.
	}
}

// earliestStart is the session clock's reading taken before the request,
// moved back by however much earlier the backend says the holding period
// started. A backend may date a grant before the call (fenceetcd's shared
// leases: the key expires with a lease refreshed earlier), and the local
// deadline must never be later than the server's expiry.
func earliestStart(start, realStart time.Time, g Grant) time.Time {
	if !g.Start.IsZero() {
		if ahead := realStart.Sub(g.Start); ahead > 0 {
			return start.Add(-ahead)
		}
	}
	return start
}

func (s *Session) endDeadline(g Grant) {
	s.end(fmt.Errorf("leasecore: session %q token %d: %w", g.Name, g.Token, ErrLocalDeadline))
}
