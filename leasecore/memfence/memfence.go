// Package memfence is an in-memory lease service and fenced resource: the
// reference backend of leasecore and the smallest example of adding one.
//
// It keeps every invariant within one process and nothing across a restart,
// so it is for tests and for reading, never for production. The conformance
// suite runs against it without a server; that never replaces the runs
// against real servers.
package memfence

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// MinTTL is the shortest TTL the in-memory lease service accepts.
const MinTTL = time.Millisecond

// Leases is an in-memory lease service. Its clock plays the server's clock.
// The zero value is not usable; call NewLeases.
type Leases struct {
	now func() time.Time

	mu    sync.Mutex
	rows  map[string]*leaseRow
	freed map[string]chan struct{} // closed on release, for WaitFree
}

type leaseRow struct {
	holder   string
	token    leasecore.Token
	expires  time.Time
	released bool
}

// NewLeases returns an empty lease service that uses now as its clock
// (time.Now when nil).
func NewLeases(now func() time.Time) *Leases {
	if now == nil {
		now = time.Now
	}
	return &Leases{now: now, rows: map[string]*leaseRow{}, freed: map[string]chan struct{}{}}
}

var (
	_ leasecore.Lease          = (*Leases)(nil)
	_ leasecore.LeaseInspector = (*Leases)(nil)
	_ backendkit.BatchRenewer  = (*Leases)(nil)
	_ backendkit.Waiter        = (*Leases)(nil)
)

// Acquire implements leasecore.Lease.
func (l *Leases) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	start := time.Now()
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	row := l.rows[name]
	if row != nil && now.Before(row.expires) {
		return leasecore.Grant{}, &leasecore.HoldError{Op: "acquire", Name: name, Holder: holder, Err: leasecore.ErrHeld}
	}
	if row == nil {
		row = &leaseRow{}
		l.rows[name] = row
	}
	row.holder, row.token, row.expires, row.released = holder, row.token+1, now.Add(ttl), false
	return leasecore.Grant{Name: name, Holder: holder, Token: row.token, TTL: ttl, Start: start}, nil
}

// Renew implements leasecore.Lease.
func (l *Leases) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	start := time.Now()
	if err := backendkit.CheckGrant(ctx, "renew", g, MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	row, err := l.current("renew", g)
	if err != nil {
		return leasecore.Grant{}, err
	}
	row.expires = l.now().Add(g.TTL)
	g.Start = start
	return g, nil
}

// RenewAll implements backendkit.BatchRenewer: every grant is judged and
// renewed on its own, under one lock.
func (l *Leases) RenewAll(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	start := time.Now()
	if err := backendkit.CheckRenewAll(ctx, gs, MinTTL); err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	renewed, lost := make([]leasecore.Grant, len(gs)), make([]error, len(gs))
	for i, g := range gs {
		row, err := l.current("renew", g)
		if err != nil {
			lost[i] = err
			continue
		}
		row.expires = l.now().Add(g.TTL)
		g.Start = start
		renewed[i] = g
	}
	return renewed, lost, nil
}

// Release implements leasecore.Lease.
func (l *Leases) Release(ctx context.Context, g leasecore.Grant) error {
	if err := backendkit.CheckGrant(ctx, "release", g, MinTTL); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	row, err := l.current("release", g)
	if err != nil {
		return err
	}
	row.expires, row.released = time.Time{}, true
	if ch, ok := l.freed[g.Name]; ok {
		close(ch)
		delete(l.freed, g.Name)
	}
	return nil
}

// WaitFree implements backendkit.Waiter: it returns at once when name is
// free, else on its release, or when the holding period's remaining time
// has passed. That time is measured in real time, so with a clock of the
// test's own it only makes an early or a late wake-up, both allowed; a
// Campaign's own bound covers the late one.
func (l *Leases) WaitFree(ctx context.Context, name string) error {
	if err := backendkit.CheckName("wait free", "name", name); err != nil {
		return err
	}
	if err := backendkit.CheckContext("wait free", ctx); err != nil {
		return err
	}
	l.mu.Lock()
	row := l.rows[name]
	now := l.now()
	if row == nil || !now.Before(row.expires) {
		l.mu.Unlock()
		return nil
	}
	remaining := row.expires.Sub(now)
	ch, ok := l.freed[name]
	if !ok {
		ch = make(chan struct{})
		l.freed[name] = ch
	}
	l.mu.Unlock()
	t := time.NewTimer(remaining)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("memfence: wait free %q: %w", name, context.Cause(ctx))
	}
}

// current returns the row of g's holding period if it is unexpired, or a
// HoldError wrapping ErrLost that says why not.
func (l *Leases) current(op string, g leasecore.Grant) (*leaseRow, error) {
	row := l.rows[g.Name]
	reason := ""
	switch {
	case row == nil:
		reason = "no such lease"
	case row.token != g.Token || row.holder != g.Holder:
		reason = fmt.Sprintf("held by %q with token %d", row.holder, row.token)
	case row.released:
		reason = "released"
	case !l.now().Before(row.expires):
		reason = "expired"
	default:
		return row, nil
	}
	return nil, &leasecore.HoldError{Op: op, Name: g.Name, Holder: g.Holder, Token: g.Token,
		Reason: reason, Err: leasecore.ErrLost}
}

// Inspect implements leasecore.LeaseInspector.
func (l *Leases) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	if err := backendkit.CheckInspect(ctx, name); err != nil {
		return leasecore.LeaseState{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := leasecore.LeaseState{Name: name}
	if row := l.rows[name]; row != nil {
		now := l.now()
		st.Exists, st.Holder, st.Token, st.Released = true, row.holder, row.token, row.released
		if now.Before(row.expires) {
			st.Held, st.Remaining = true, row.expires.Sub(now)
		}
	}
	return st, nil
}
