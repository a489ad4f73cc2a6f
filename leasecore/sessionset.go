package leasecore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// SessionSet keeps many leases of one holder: shard ownership, where one
// process owns hundreds of names. It renews all of them with one RenewAll
// per interval (one statement on PostgreSQL, one keep-alive on etcd with
// shared leases) instead of one round trip per name. Each name keeps its
// own token, its own local deadline and its own fate: a name that is lost
// drops out of the set; the others go on.
//
// As with Session, every write for a name must carry Token(name), and
// Valid(name) and Context(name) only help to stop early. A name leaves the
// set at its local deadline by the set's clock even while a RenewAll hangs,
// and a renewal that answers after a name's deadline does not bring it
// back. Close must be called.
type SessionSet struct {
	lease   Lease
	renewer batchRenewer
	holder  string
	cfg     sessionConfig

	mu     sync.Mutex
	held   map[string]*setEntry
	lost   chan LostName
	closed bool

	kick   chan struct{} // a name was added: the deadline timer may need to move
	cancel context.CancelFunc
	done   chan struct{} // closed when the renewal goroutine returned
	once   sync.Once
	err    error // Close's result
}

type setEntry struct {
	grant    Grant
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelCauseFunc
}

// LostName reports a name that left a SessionSet other than by Release:
// Err wraps ErrLost (a renewal found the hold over) or ErrLocalDeadline.
type LostName struct {
	Name  string
	Token Token
	Err   error
}

// NewSessionSet returns an empty set for holder on lease, which must also
// renew many leases at once (backendkit.BatchRenewer: fencepg and fenceetcd
// lease stores do). The options are Session's: WithTTL,
// WithRenewInterval, WithMargin, WithRenewTimeout and WithClock apply to
// every name; a set reports to no observer (WithRenewObserver,
// WithSessionObserver and WithLogger are ignored): Lost reports its losses.
func NewSessionSet(lease Lease, holder string, opts ...SessionOption) (*SessionSet, error) {
	cfg, err := newSessionConfig("new session set", lease, opts)
	if err != nil {
		return nil, err
	}
	renewer, ok := lease.(batchRenewer)
	if !ok {
		return nil, &ArgError{Op: "new session set", Field: "lease", Value: fmt.Sprintf("%T", lease),
			Reason: "does not implement backendkit.BatchRenewer (RenewAll)"}
	}
	if err := checkName("new session set", "holder", holder); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &SessionSet{lease: lease, renewer: renewer, holder: holder, cfg: cfg, held: map[string]*setEntry{},
		lost: make(chan LostName, 64), kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go s.renewLoop(ctx)
	return s, nil
}

// Acquire adds name to the set. It returns an error wrapping ErrHeld when
// another holder has it (the set is unchanged), ErrLocalDeadline when the
// acquire took longer than ttl - margin (the grant is given back), or
// ErrClosed after Close.
func (s *SessionSet) Acquire(ctx context.Context, name string) (Token, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, fmt.Errorf("leasecore: session set: acquire %q: %w", name, ErrClosed)
	}
	if e, ok := s.held[name]; ok {
		s.mu.Unlock()
		return e.grant.Token, nil // already ours
	}
	s.mu.Unlock()
	start, realStart := s.cfg.clock.Now(), time.Now() // before the request
	g, err := s.lease.Acquire(ctx, name, s.holder, s.cfg.ttl)
	if err != nil {
		return 0, err
	}
	t, err := s.admit(ctx, name, g, start, realStart)
	if err != nil {
		return 0, err
	}
	s.kickLoop()
	return t, nil
}

// AcquireAll adds names to the set, each as Acquire would, in as few
// requests as the lease allows. It returns, in the order of names, the
// token of each name the set holds afterwards, or in errs[i] why not:
// what Acquire would have returned for that name (ErrHeld when another
// holder has it, ErrLocalDeadline, ErrClosed, or the backend's error for
// that name). err is for the call as a whole; then the set holds none of
// the names it did not hold before.
//
// The call sequence:
//
//  1. The names are validated (backendkit.CheckAcquireAll with the set's
//     holder and TTL: 1 to 1000 distinct names, backendkit.MaxAcquireAll):
//     bad input, or ctx done, is err and nothing is sent. After Close, err
//     wraps ErrClosed.
//  2. A name the set holds already keeps its grant: tokens[i] is its
//     token, with no request.
//  3. The others are acquired. When the set's lease implements
//     backendkit.BatchAcquirer, with ONE AcquireAll for all of them, the
//     set's clock read once before it; an err of that call is AcquireAll's
//     err (the backend gave back or undid whatever it granted, see
//     backendkit.BatchAcquirer).
//     Otherwise with one Lease.Acquire per name, in order, the clock read
//     before each; an error of one is that name's errs[i] and the others
//     go on (after ctx ends, each fails at once with ctx's error).
//  4. Each grant is admitted by the rules of Acquire: its local deadline
//     counts from the clock reading taken before its request (moved back
//     when the backend dates the grant earlier, as fenceetcd's shared
//     leases do); a grant whose deadline has passed by the set's clock is
//     given back (Release, best effort) and its name fails with
//     ErrLocalDeadline; after Close, it is given back and fails with
//     ErrClosed; otherwise the name joins the set with its own token,
//     context and deadline, and is renewed by the set's RenewAll from then
//     on.
//  5. The renewal goroutine is told once, so that its deadline timer
//     covers the new names.
//
// A refused or failed name leaves the set as it was; the names granted
// are the set's even when others failed.
func (s *SessionSet) AcquireAll(ctx context.Context, names []string) (tokens []Token, errs []error, err error) {
	if err := checkAcquireAll(ctx, names, s.holder, s.cfg.ttl, 0); err != nil {
		return nil, nil, err
	}
	tokens, errs = make([]Token, len(names)), make([]error, len(names))
	var todo []int // indexes of the names to acquire
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("leasecore: session set: acquire all: %w", ErrClosed)
	}
	for i, name := range names {
		if e, ok := s.held[name]; ok {
			tokens[i] = e.grant.Token // already ours
		} else {
			todo = append(todo, i)
		}
	}
	s.mu.Unlock()
	if len(todo) == 0 {
		return tokens, errs, nil
	}
	admitted := false
	defer func() {
		if admitted {
			s.kickLoop()
		}
	}()

	batch, ok := s.lease.(batchAcquirer)
	if !ok {
		for _, i := range todo {
			start, realStart := s.cfg.clock.Now(), time.Now() // before the request
			g, err := s.lease.Acquire(ctx, names[i], s.holder, s.cfg.ttl)
			if err != nil {
				errs[i] = err
				continue
			}
			tokens[i], errs[i] = s.admit(ctx, names[i], g, start, realStart)
			admitted = admitted || errs[i] == nil
		}
		return tokens, errs, nil
	}

	ask := make([]string, len(todo))
	for j, i := range todo {
		ask[j] = names[i]
	}
	start, realStart := s.cfg.clock.Now(), time.Now() // before the request
	gs, es, err := batch.AcquireAll(ctx, ask, s.holder, s.cfg.ttl)
	if err != nil {
		return nil, nil, err
	}
	if len(gs) != len(ask) || len(es) != len(ask) {
		// A broken backend: give back what it says it granted.
		for j, g := range gs {
			if g.Token != 0 && (j >= len(es) || es[j] == nil) {
				s.cfg.releaseBestEffort(ctx, s.lease, g)
			}
		}
		return nil, nil, fmt.Errorf("leasecore: session set: acquire all: %T.AcquireAll returned %d grants and %d errors for %d names",
			s.lease, len(gs), len(es), len(ask))
	}
	for j, i := range todo {
		if es[j] != nil {
			errs[i] = es[j]
			continue
		}
		tokens[i], errs[i] = s.admit(ctx, names[i], gs[j], start, realStart)
		admitted = admitted || errs[i] == nil
	}
	return tokens, errs, nil
}

// admit applies Acquire's rules to g, a grant of name whose request was
// sent after the set's clock read start (and time.Now() read realStart):
// it gives g back and returns ErrClosed after Close, or ErrLocalDeadline
// when the local deadline has passed by the set's clock; otherwise name
// joins the set. The caller tells the renewal goroutine afterwards
// (kickLoop), once for any number of names.
func (s *SessionSet) admit(ctx context.Context, name string, g Grant, start, realStart time.Time) (Token, error) {
	g.Start = earliestStart(start, realStart, g)
	deadline := g.LocalDeadline(s.cfg.margin)
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		s.cfg.releaseBestEffort(ctx, s.lease, g)
		return 0, fmt.Errorf("leasecore: session set: acquire %q: %w", name, ErrClosed)
	case !s.cfg.clock.Now().Before(deadline):
		s.mu.Unlock()
		s.cfg.releaseBestEffort(ctx, s.lease, g)
		return 0, fmt.Errorf("leasecore: session set: acquire %q: acquire took longer than ttl - margin (%v): %w",
			name, s.cfg.ttl-s.cfg.margin, ErrLocalDeadline)
	}
	ectx, cancel := context.WithCancelCause(context.Background())
	s.held[name] = &setEntry{grant: g, deadline: deadline, ctx: ectx, cancel: cancel}
	s.mu.Unlock()
	return g.Token, nil
}

// kickLoop tells the renewal goroutine that names were added: its deadline
// timer may need to move.
func (s *SessionSet) kickLoop() {
	select {
	case s.kick <- struct{}{}:
	default: // a kick is pending already
	}
}

// Token returns the token of name; ok is false when the set does not hold
// it.
func (s *SessionSet) Token(name string) (t Token, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[name]
	if !ok {
		return 0, false
	}
	return e.grant.Token, true
}

// Grant returns the current grant of name (its Start moves with each
// renewal); ok is false when the set does not hold it. Grant.Claim builds
// the claim to write under it.
func (s *SessionSet) Grant(name string) (g Grant, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[name]
	if !ok {
		return Grant{}, false
	}
	return e.grant, true
}

// Valid reports whether the set holds name and its local deadline has not
// passed.
func (s *SessionSet) Valid(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[name]
	return ok && s.cfg.clock.Now().Before(e.deadline)
}

// Context returns a context that is cancelled when name leaves the set:
// lost, past its local deadline (as in LostName.Err), released or closed
// (ErrClosed); context.Cause says which. ok is false when the set does not
// hold name. See Session.Context.
func (s *SessionSet) Context(name string) (ctx context.Context, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[name]
	if !ok {
		return nil, false
	}
	return e.ctx, true
}

// Names returns the names the set holds.
func (s *SessionSet) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.held))
	for n := range s.held {
		names = append(names, n)
	}
	return names
}

// Lost delivers the names that leave the set other than by Release. It is
// buffered; a caller that does not read it loses no renewals, only the
// reports beyond the buffer.
func (s *SessionSet) Lost() <-chan LostName { return s.lost }

// Release gives name back and removes it from the set. A name the set does
// not hold is not an error.
func (s *SessionSet) Release(ctx context.Context, name string) error {
	s.mu.Lock()
	e, ok := s.held[name]
	delete(s.held, name)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	e.cancel(fmt.Errorf("leasecore: session set %q token %d released: %w", name, e.grant.Token, ErrClosed))
	if err := s.lease.Release(ctx, e.grant); err != nil && !errors.Is(err, ErrLost) {
		return err
	}
	return nil
}

// Close stops renewal and releases every name. It waits for the renewal
// goroutine, or for ctx to end: then it returns an error wrapping ctx's
// cause without releasing, and the goroutine goes away once the RenewAll in
// flight returns. It is idempotent; later calls return the first call's
// result.
func (s *SessionSet) Close(ctx context.Context) error {
	s.once.Do(func() {
		s.cancel()
		waited := true
		select {
		case <-s.done:
		default:
			select {
			case <-s.done:
			case <-ctx.Done():
				waited = false
			}
		}
		s.mu.Lock()
		s.closed = true
		held := s.held
		s.held = map[string]*setEntry{}
		s.mu.Unlock()
		for name, e := range held {
			e.cancel(fmt.Errorf("leasecore: session set %q token %d: %w", name, e.grant.Token, ErrClosed))
		}
		if !waited {
			s.err = fmt.Errorf("leasecore: close session set: a renewal is still in flight, %d names not released: %w",
				len(held), context.Cause(ctx))
			return
		}
		for _, e := range held {
			if rerr := s.lease.Release(ctx, e.grant); rerr != nil && !errors.Is(rerr, ErrLost) {
				s.err = errors.Join(s.err, rerr)
			}
		}
	})
	return s.err
}

// dropLocked removes name, cancels its context and reports it on Lost.
func (s *SessionSet) dropLocked(name string, e *setEntry, err error) {
	delete(s.held, name)
	e.cancel(err)
	select {
	case s.lost <- LostName{Name: name, Token: e.grant.Token, Err: err}:
	default:
	}
}

// expireLocked drops every name whose local deadline is not after now, and
// returns the earliest deadline left (zero when none).
func (s *SessionSet) expireLocked(now time.Time) (next time.Time) {
	for name, e := range s.held {
		if !now.Before(e.deadline) {
			s.dropLocked(name, e, fmt.Errorf("leasecore: session set %q token %d: %w", name, e.grant.Token, ErrLocalDeadline))
			continue
		}
		if next.IsZero() || e.deadline.Before(next) {
			next = e.deadline
		}
	}
	return next
}

// deadlineTimer fires at the earliest local deadline of the set, so names
// end on time while the loop waits for a tick or for a RenewAll.
type deadlineTimer struct {
	clock Clock
	at    time.Time
	t     Timer
}

// C returns the timer's channel; nil (never ready) when no name is held.
func (d *deadlineTimer) C() <-chan time.Time {
	if d.t == nil {
		return nil
	}
	return d.t.C()
}

// set moves the timer to at (zero: no timer).
func (d *deadlineTimer) set(at time.Time) {
	if d.t != nil && at.Equal(d.at) {
		return
	}
	d.stop()
	d.at = at
	if !at.IsZero() {
		d.t = d.clock.NewTimer(at.Sub(d.clock.Now()))
	}
}

func (d *deadlineTimer) stop() {
	if d.t != nil {
		d.t.Stop()
		d.t = nil
	}
}

// expire drops the names whose deadline passed and moves the timer to the
// next one.
func (s *SessionSet) expire(dl *deadlineTimer) {
	s.mu.Lock()
	next := s.expireLocked(s.cfg.clock.Now())
	s.mu.Unlock()
	dl.t = nil // fired, or to be replaced
	dl.set(next)
}

func (s *SessionSet) renewLoop(ctx context.Context) {
	defer close(s.done)
	dl := &deadlineTimer{clock: s.cfg.clock}
	defer dl.stop()
	type reply struct {
		renewed []Grant
		lost    []error
		err     error
	}
	wait := s.cfg.interval
	for {
		tick := s.cfg.clock.NewTimer(wait)
	idle:
		for {
			select {
			case <-ctx.Done():
				tick.Stop()
				return
			case <-dl.C():
				s.expire(dl)
			case <-s.kick:
				s.mu.Lock()
				next := s.expireLocked(s.cfg.clock.Now())
				s.mu.Unlock()
				dl.set(next)
			case <-tick.C():
				break idle
			}
		}

		start, realStart := s.cfg.clock.Now(), time.Now() // before the request
		s.mu.Lock()
		next := s.expireLocked(start)
		var gs []Grant
		for _, e := range s.held {
			gs = append(gs, e.grant)
		}
		s.mu.Unlock()
		dl.set(next)
		wait = s.cfg.interval
		if len(gs) == 0 {
			continue
		}

		// One attempt with its own timeout, as Session's; the deadline timer
		// keeps running meanwhile.
		timeout := min(s.cfg.renewTimeout, next.Sub(start))
		actx, cancel := context.WithCancel(ctx)
		attemptTimer := s.cfg.clock.NewTimer(timeout)
		replies := make(chan reply, 1)
		go func() {
			r, l, err := s.renewer.RenewAll(actx, gs)
			replies <- reply{r, l, err}
		}()
		var rep reply
	await:
		for {
			select {
			case rep = <-replies:
				break await
			case <-attemptTimer.C():
				cancel() // and wait for the request to give up
			case <-dl.C():
				s.expire(dl)
			case <-s.kick:
				s.mu.Lock()
				n := s.expireLocked(s.cfg.clock.Now())
				s.mu.Unlock()
				dl.set(n)
			case <-ctx.Done():
				cancel()
				attemptTimer.Stop()
				<-replies
				return
			}
		}
		cancel()
		attemptTimer.Stop()
		wait = start.Add(s.cfg.interval).Sub(s.cfg.clock.Now())
		if rep.err != nil {
			continue // may pass; each name's deadline ends it otherwise
		}
		// Apply under the lock Valid takes, with the clock read there: a
		// name whose deadline passed while the request ran stays gone.
		s.mu.Lock()
		now := s.cfg.clock.Now()
		for i, g := range gs {
			e, ok := s.held[g.Name]
			if !ok || e.grant.Token != g.Token {
				continue // released or expired meanwhile
			}
			if rep.lost[i] != nil {
				s.dropLocked(g.Name, e, rep.lost[i])
				continue
			}
			if !now.Before(e.deadline) {
				s.dropLocked(g.Name, e, fmt.Errorf("leasecore: session set %q token %d: %w", g.Name, g.Token, ErrLocalDeadline))
				continue
			}
			r := rep.renewed[i]
			r.Start = earliestStart(start, realStart, r)
			e.grant, e.deadline = r, r.LocalDeadline(s.cfg.margin)
		}
		next = s.expireLocked(now)
		s.mu.Unlock()
		dl.set(next)
	}
}
