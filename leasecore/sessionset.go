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
// Valid(name) only helps to stop early. Close must be called.
type SessionSet struct {
	lease    Lease
	renewer  BatchRenewer
	holder   string
	clock    Clock
	ttl      time.Duration
	margin   time.Duration
	interval time.Duration

	mu     sync.Mutex
	held   map[string]*setEntry
	lost   chan LostName
	closed bool

	cancel context.CancelFunc
	done   chan struct{} // closed when the renewal goroutine returned
	once   sync.Once
}

type setEntry struct {
	grant    Grant
	deadline time.Time
}

// LostName reports a name that left a SessionSet other than by Release:
// Err wraps ErrLost (a renewal found the hold over) or ErrLocalDeadline.
type LostName struct {
	Name  string
	Token Token
	Err   error
}

// NewSessionSet returns an empty set for holder on lease, which must also
// implement BatchRenewer. The options are Session's: WithTTL,
// WithRenewInterval, WithMargin and WithClock apply to every name.
func NewSessionSet(lease Lease, holder string, opts ...SessionOption) (*SessionSet, error) {
	cfg, err := newSessionConfig("new session set", lease, opts)
	if err != nil {
		return nil, err
	}
	renewer, ok := lease.(BatchRenewer)
	if !ok {
		return nil, &ArgError{Op: "new session set", Field: "lease", Value: fmt.Sprintf("%T", lease),
			Reason: "does not implement leasecore.BatchRenewer"}
	}
	if err := CheckName("new session set", "holder", holder); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &SessionSet{lease: lease, renewer: renewer, holder: holder, clock: cfg.clock, ttl: cfg.ttl,
		margin: cfg.margin, interval: cfg.interval, held: map[string]*setEntry{},
		lost: make(chan LostName, 64), cancel: cancel, done: make(chan struct{})}
	go s.renewLoop(ctx)
	return s, nil
}

// Acquire adds name to the set. It returns an error wrapping ErrHeld when
// another holder has it (the set is unchanged), or ErrClosed after Close.
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
	start, realStart := s.clock.Now(), time.Now() // before the request
	g, err := s.lease.Acquire(ctx, name, s.holder, s.ttl)
	if err != nil {
		return 0, err
	}
	g.Start = earliestStart(start, realStart, g)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = s.lease.Release(context.WithoutCancel(ctx), g)
		return 0, fmt.Errorf("leasecore: session set: acquire %q: %w", name, ErrClosed)
	}
	s.held[name] = &setEntry{grant: g, deadline: g.LocalDeadline(s.margin)}
	return g.Token, nil
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

// Valid reports whether the set holds name and its local deadline has not
// passed.
func (s *SessionSet) Valid(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[name]
	return ok && s.clock.Now().Before(e.deadline)
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
	if err := s.lease.Release(ctx, e.grant); err != nil && !errors.Is(err, ErrLost) {
		return err
	}
	return nil
}

// Close stops renewal and releases every name. It is idempotent.
func (s *SessionSet) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.cancel()
		<-s.done
		s.mu.Lock()
		s.closed = true
		held := s.held
		s.held = map[string]*setEntry{}
		s.mu.Unlock()
		for _, e := range held {
			if rerr := s.lease.Release(ctx, e.grant); rerr != nil && !errors.Is(rerr, ErrLost) {
				err = errors.Join(err, rerr)
			}
		}
	})
	return err
}

func (s *SessionSet) drop(name string, t Token, err error) {
	delete(s.held, name)
	select {
	case s.lost <- LostName{Name: name, Token: t, Err: err}:
	default:
	}
}

func (s *SessionSet) renewLoop(ctx context.Context) {
	defer close(s.done)
	for {
		tick := s.clock.NewTimer(s.interval)
		select {
		case <-ctx.Done():
			tick.Stop()
			return
		case <-tick.C():
		}
		start, realStart := s.clock.Now(), time.Now() // before the request
		s.mu.Lock()
		var gs []Grant
		for name, e := range s.held {
			if !start.Before(e.deadline) {
				s.drop(name, e.grant.Token, fmt.Errorf("leasecore: session set %q token %d: %w", name, e.grant.Token, ErrLocalDeadline))
				continue
			}
			gs = append(gs, e.grant)
		}
		s.mu.Unlock()
		if len(gs) == 0 {
			continue
		}
		renewed, lost, err := s.renewer.RenewAll(ctx, gs)
		if err != nil {
			continue // may pass; each name's deadline ends it otherwise
		}
		s.mu.Lock()
		for i, g := range gs {
			e, ok := s.held[g.Name]
			if !ok || e.grant.Token != g.Token {
				continue // released meanwhile
			}
			if lost[i] != nil {
				s.drop(g.Name, g.Token, lost[i])
				continue
			}
			r := renewed[i]
			r.Start = earliestStart(start, realStart, r)
			e.grant, e.deadline = r, r.LocalDeadline(s.margin)
		}
		s.mu.Unlock()
	}
}
