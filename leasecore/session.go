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
// A Session ends, closing Done and cancelling Context, when a renewal
// finds the hold lost (ErrLost), when the local deadline passes without a
// successful renewal (ErrLocalDeadline), or when Close is called
// (ErrClosed). An ended session never revives: acquire a new one, which
// gets a new token. Close must be called in every case; it stops the
// renewal goroutine.
//
// Each renew attempt has its own timeout (WithRenewTimeout, by default the
// renew interval, never past the local deadline): a request stuck on a
// half-open connection is cancelled, and the next attempt, on a new
// connection, can still keep the lease.
type Session struct {
	lease        Lease
	clock        Clock
	margin       time.Duration
	interval     time.Duration
	renewTimeout time.Duration
	onRenew      func(RenewEvent)
	observe      func(SessionEvent) // WithSessionObserver, WithLogger

	mu       sync.Mutex
	grant    Grant
	deadline time.Time
	err      error // why the session ended; nil while it runs

	ctx        context.Context // cancelled with err as its cause when the session ends
	cancelCtx  context.CancelCauseFunc
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
	renewTimeout           time.Duration // 0: the renew interval
	renewTimeoutSet        bool
	clock                  Clock
	onRenew                func(RenewEvent)
	observe                func(SessionEvent)
}

// defaultSessionTTL is the TTL of a Session without WithTTL.
const defaultSessionTTL = 15 * time.Second

// WithTTL sets the lease TTL (default 15 s).
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

// WithRenewTimeout sets how long one renew attempt may take before its
// context is cancelled and it counts as failed (default: the renew
// interval, so a stuck attempt ends by the next one). An attempt never runs
// past the local deadline. The same bound applies to the best-effort
// releases the session makes on its own. Renew and Release must return
// soon after their context ends; one that does not still delays the next
// attempt, though never the end of the session at its local deadline.
func WithRenewTimeout(d time.Duration) SessionOption {
	return func(c *sessionConfig) { c.renewTimeout, c.renewTimeoutSet = d, true }
}

// WithClock sets the local clock (default: the process's clock).
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
	cfg := sessionConfig{ttl: defaultSessionTTL, clock: systemClock{}}
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.intervalSet {
		cfg.interval = cfg.ttl / 4
	}
	if !cfg.marginSet {
		cfg.margin = cfg.ttl / 5
	}
	if !cfg.renewTimeoutSet {
		cfg.renewTimeout = cfg.interval
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
	if err := checkTTL(op, c.ttl, 0); err != nil {
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
	case c.renewTimeout <= 0:
		return bad("renew timeout", c.renewTimeout, "must be positive")
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
		cfg.acquireFailed(Grant{Name: name, Holder: holder}, start, err)
		return nil, err
	}
	return cfg.startSession(ctx, lease, g, start, realStart)
}

// newQueuedSession is NewSession for a Lease that waits in line
// (backendkit.QueuedAcquirer, q: lease as one): it waits until the lease
// is its caller's.
func newQueuedSession(ctx context.Context, q queuedAcquirer, lease Lease, name, holder string, cfg sessionConfig) (*Session, error) {
	before, realBefore := cfg.clock.Now(), time.Now()
	g, err := q.AcquireQueued(ctx, name, holder, cfg.ttl)
	if err != nil {
		cfg.acquireFailed(Grant{Name: name, Holder: holder}, before, err)
		return nil, err
	}
	if g.Start.IsZero() {
		// Undated: the reading before the wait is the only safe start.
		return cfg.startSession(ctx, lease, g, before, realBefore)
	}
	// A grant handed over while we waited is dated by the backend (the
	// start of the TTL it counts): map that onto the session's clock from
	// a reading taken now.
	return cfg.startSession(ctx, lease, g, cfg.clock.Now(), time.Now())
}

// startSession starts the session of grant g, whose holding period began
// no earlier than start on the session's clock (realStart the same instant
// by the wall clock; g.Start, when earlier, moves it back).
func (cfg *sessionConfig) startSession(ctx context.Context, lease Lease, g Grant, start, realStart time.Time) (*Session, error) {
	g.Start = earliestStart(start, realStart, g)
	deadline := g.LocalDeadline(cfg.margin)
	if !cfg.clock.Now().Before(deadline) {
		// The acquire took longer than ttl - margin: the grant is unusable.
		// Give it back so nobody waits for it to expire.
		cfg.releaseBestEffort(ctx, lease, g)
		err := fmt.Errorf("leasecore: new session %q: acquire took longer than ttl - margin (%v): %w",
			g.Name, cfg.ttl-cfg.margin, ErrLocalDeadline)
		cfg.acquireFailed(g, start, err)
		return nil, err
	}

	loopCtx, cancel := context.WithCancel(context.Background())
	sessCtx, cancelSess := context.WithCancelCause(context.Background())
	s := &Session{
		lease:        lease,
		clock:        cfg.clock,
		margin:       cfg.margin,
		interval:     cfg.interval,
		renewTimeout: cfg.renewTimeout,
		onRenew:      cfg.onRenew,
		observe:      cfg.observe,
		grant:        g,
		deadline:     deadline,
		ctx:          sessCtx,
		cancelCtx:    cancelSess,
		done:         make(chan struct{}),
		loopCtx:      loopCtx,
		cancelLoop:   cancel,
		loopDone:     make(chan struct{}),
	}
	if s.observe != nil { // before the renewal goroutine can report anything
		s.observe(SessionEvent{Kind: SessionAcquired, Grant: g, Deadline: deadline, Latency: cfg.clock.Now().Sub(start)})
	}
	go s.renewLoop()
	return s, nil
}

// errReleaseTimeout is the cause of a best-effort release's context when its
// time is up.
var errReleaseTimeout = fmt.Errorf("leasecore: best-effort release timed out: %w", ErrUnavailable)

// releaseBestEffort gives g back when nobody waits for the answer (a grant
// that came too late, a name acquired after Close). It does not inherit
// ctx's cancellation, the caller having usually given up already, but is
// bounded by the renew timeout on the session's clock: after the TTL the
// lease frees itself anyway.
func (c *sessionConfig) releaseBestEffort(ctx context.Context, lease Lease, g Grant) {
	rctx, cancel := withClockTimeout(context.WithoutCancel(ctx), c.clock, c.renewTimeout, errReleaseTimeout)
	defer cancel()
	_ = lease.Release(rctx, g)
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

// Claim returns the claim to write in scope under this session: its token
// and token space (Grant.Space), with the session's holder as the writer.
// Carrying the space lets the fence tell a token from another lease service
// from a stale one (ErrTokenSpace).
func (s *Session) Claim(scope string) Claim { return s.Grant().Claim(scope) }

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

// Context returns a context that is cancelled when the session ends, with
// Err() as its cause (context.Cause): an error wrapping ErrLocalDeadline,
// ErrLost or ErrClosed. Work done for the holder should run under it, so it
// stops when the holder must.
//
// The local deadline is timer-driven by the session's clock, so the context
// is cancelled on time even while a renewal hangs. It counts from a clock
// reading taken before the request, so it is cancelled before the backend
// can grant the lease to anyone else, as long as the two clocks run at the
// same rate and the margin covers the time the renewal goroutine needs to
// be scheduled. A cancelled context is still no protection for a write
// that is already under way: the token check is.
//
// The context carries no values and no deadline; it is not derived from
// NewSession's ctx, which bounds the acquire only. To end work on either,
// derive from your own context and stop it with context.AfterFunc on this
// one, as Campaign does for its function.
func (s *Session) Context() context.Context { return s.ctx }

// Err returns nil while the session runs, and afterwards why it ended: an
// error wrapping ErrLost, ErrLocalDeadline or ErrClosed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops renewal and releases the lease unless the hold is already
// known lost. It waits for the renewal goroutine to return, or for ctx to
// end: a renewal that ignores its cancelled context cannot hold Close up,
// the goroutine then goes away once that renewal returns, and Close returns
// an error wrapping ctx's cause without releasing. A release that finds the
// hold already over is not an error. Close is idempotent; later calls
// return the first call's result. When the release fails (ctx done, backend
// unreachable) the lease stays held until its TTL runs out; the token is
// still never reused, so nothing unsafe follows.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.cancelLoop()
		select {
		case <-s.loopDone:
		default:
			select {
			case <-s.loopDone:
			case <-ctx.Done():
				s.mu.Lock()
				ended, g := s.endLocked(ErrClosed), s.grant
				s.mu.Unlock()
				s.closeErr = fmt.Errorf("leasecore: close session %q token %d: a renewal is still in flight, lease not released: %w",
					g.Name, g.Token, context.Cause(ctx))
				if ended {
					s.emitEnded(g, closedErr(s.closeErr))
				}
				return
			}
		}
		s.mu.Lock()
		prior, g := s.err, s.grant
		s.endLocked(ErrClosed)
		s.mu.Unlock()
		if errors.Is(prior, ErrLost) {
			return // nothing left to release
		}
		// Also after the local deadline: the server may still hold the
		// lease for up to the margin, and releasing frees it at once.
		if err := s.lease.Release(ctx, g); err != nil && !errors.Is(err, ErrLost) {
			s.closeErr = err
		}
		if prior == nil { // a session that ended before reported it then
			s.emitEnded(g, closedErr(s.closeErr))
		}
	})
	return s.closeErr
}

// end records why the session ended, once, closes Done, cancels Context
// and reports the end (after the lock: an observer may call the session's
// methods).
func (s *Session) end(err error) {
	s.mu.Lock()
	ended, g := s.endLocked(err), s.grant
	s.mu.Unlock()
	if ended {
		s.emitEnded(g, err)
	}
}

// endLocked ends the session with err unless it already ended, and reports
// whether it did.
func (s *Session) endLocked(err error) bool {
	if s.err != nil {
		return false
	}
	s.err = err
	close(s.done)
	s.cancelCtx(err)
	return true
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
	// The first renewal is due one interval after the reading taken before
	// the acquire, as each later one is due one interval after the reading
	// before its renew request: the deadline counts from that reading, so a
	// slow acquire must not push the first renewal towards the deadline.
	wait := g.Start.Add(s.interval).Sub(s.clock.Now())
	failed := 0 // attempts failed since the last success, for SessionEvent.Late
	for {
		tick := s.clock.NewTimer(wait)
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
		// Attempts start every interval, each with its own timeout, so one
		// stuck request (a half-open connection) costs one attempt, not
		// every attempt until the deadline.
		timeout := min(s.renewTimeout, deadline.Sub(start))
		ctx, cancel := context.WithCancel(s.loopCtx)
		attemptTimer := s.clock.NewTimer(timeout)
		replies := make(chan reply, 1)
		go func() {
			r, err := s.lease.Renew(ctx, g)
			replies <- reply{r, err}
		}()
		var rep reply
		timedOut := false
	await:
		for {
			select {
			case rep = <-replies:
				break await
			case <-attemptTimer.C():
				timedOut = true
				cancel() // and wait for the request to give up
			case <-expire.C():
				// A renewal that answers now is useless: the owner must be
				// told to stop at the deadline, not when the request gives up.
				s.endDeadline(g)
				cancel()
				attemptTimer.Stop()
				<-replies
				return
			case <-s.loopCtx.Done():
				cancel()
				attemptTimer.Stop()
				<-replies
				return // Close is waiting, or gave up waiting
			}
		}
		cancel()
		attemptTimer.Stop()
		if s.loopCtx.Err() != nil {
			return // Close came first; its renewal is not reported
		}
		var took time.Duration
		if s.observe != nil {
			took = s.clock.Now().Sub(start)
		}

		ev := RenewEvent{Start: start, Err: rep.err}
		if rep.err != nil && timedOut {
			ev.Err = fmt.Errorf("leasecore: session %q token %d: renew attempt timed out after %v: %w: %w",
				g.Name, g.Token, timeout, ErrUnavailable, rep.err)
		}
		if rep.err == nil {
			ng := rep.g
			ng.Start = earliestStart(start, realStart, ng)
			nd := ng.LocalDeadline(s.margin)
			// Check and publish under the lock Valid takes: a Valid between
			// them could otherwise see the deadline passed and then the
			// session valid again.
			s.mu.Lock()
			if !s.clock.Now().Before(deadline) {
				// Answered just as the deadline passed: the session does not
				// come back to life once Valid may have reported false.
				err := deadlineErr(g)
				ended := s.endLocked(err)
				s.mu.Unlock()
				if ended {
					s.emitEnded(g, err)
				}
				return
			}
			s.grant, s.deadline = ng, nd
			s.mu.Unlock()
			g, deadline = ng, nd
			ev.Grant, ev.Deadline = g, deadline
			expire.Stop()
			expire = s.clock.NewTimer(deadline.Sub(s.clock.Now()))
		}
		if s.onRenew != nil {
			s.onRenew(ev)
		}
		if s.observe != nil {
			s.emitRenew(g, deadline, took, failed, ev.Err)
		}
		if ev.Err != nil {
			failed++
		} else {
			failed = 0
		}
		if errors.Is(rep.err, ErrLost) {
			s.end(rep.err)
			return
		}
		// Any other error (connection lost, timeout) may pass: try again at
		// the next tick. The deadline timer ends the session if no renewal
		// succeeds in time.
		wait = start.Add(s.interval).Sub(s.clock.Now())
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

func (s *Session) endDeadline(g Grant) { s.end(deadlineErr(g)) }

// endIfPastDeadline ends the session at its local deadline when the
// session's clock has passed it, without waiting for the renewal
// goroutine's timer to fire. A renewal answered from now on cannot revive
// it: an ended session stays ended.
func (s *Session) endIfPastDeadline() {
	s.mu.Lock()
	past, g := s.err == nil && !s.clock.Now().Before(s.deadline), s.grant
	s.mu.Unlock()
	if past {
		s.endDeadline(g)
	}
}

func deadlineErr(g Grant) error {
	return fmt.Errorf("leasecore: session %q token %d: %w", g.Name, g.Token, ErrLocalDeadline)
}
