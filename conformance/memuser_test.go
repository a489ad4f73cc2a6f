package conformance_test

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// memUserData is the in-memory harness's "user data": two user tables (a
// job-run header and its lines) behind a fence of their own, with an
// attempt log of every check. A write decides at commit: its "statements"
// (InTransaction, the commit gap) run holding nothing, then it compares
// the token with the scope's floor and stores both tables under one
// mutex: one atomic operation, like an etcd Txn.
type memUserData struct {
	waiting   atomic.Int64 // writes blocked on mu, for LockWaits
	mu        sync.Mutex
	floorLock sync.Mutex // held through a transaction by the suite's own broken resource (lockingUser)
	floors    map[string]leasecore.Token
	tables    [2]map[[2]string]leasecore.StoredPart // job_run, job_line
	log       []leasecore.Attempt
}

var memUserTables = [2]string{"job_run", "job_line"}

func newMemUserData() *memUserData {
	return &memUserData{floors: map[string]leasecore.Token{},
		tables: [2]map[[2]string]leasecore.StoredPart{{}, {}}}
}

// memUser is one client of memUserData: the fenced user resource.
type memUser struct {
	*memUserData
	gap conformance.Gap
}

var _ conformance.UserResource = (*memUser)(nil)

// check compares cl's token with the floor and records the attempt; the
// caller holds mu. It returns the result and, on acceptance, advances the
// floor and applies the write.
func (u *memUser) check(cl leasecore.Claim, part string, apply func(now time.Time)) (leasecore.Result, error) {
	floor := u.floors[cl.Scope]
	accepted := cl.Token >= floor
	if accepted {
		floor = cl.Token
	}
	now := time.Now()
	if accepted {
		u.floors[cl.Scope] = floor
		apply(now)
	}
	u.log = append(u.log, leasecore.Attempt{Scope: cl.Scope, Part: part, Writer: cl.Writer, Token: cl.Token,
		Accepted: accepted, Floor: floor, At: now})
	return leasecore.Result{Accepted: accepted, Floor: floor}, nil
}

func (u *memUser) lock() {
	u.waiting.Add(1)
	u.mu.Lock()
	u.waiting.Add(-1)
}

func (u *memUser) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	// The write's statements and its commit gap hold nothing: only the
	// commit below takes the mutex.
	if err := conformance.InTransaction(ctx, w, func(context.Context) error { return nil }); err != nil {
		return leasecore.Result{}, err
	}
	if u.gap != nil {
		if err := u.gap(ctx, w); err != nil {
			return leasecore.Result{}, err
		}
	}
	u.lock()
	defer u.mu.Unlock()
	return u.check(backendkit.ClaimOf(w), w.Part, func(now time.Time) { u.store(w, now) })
}

func (u *memUser) Advance(ctx context.Context, cl leasecore.Claim) (leasecore.Result, error) {
	if err := backendkit.CheckClaim(ctx, "advance", cl); err != nil {
		return leasecore.Result{}, err
	}
	u.lock()
	defer u.mu.Unlock()
	return u.check(cl, "", func(time.Time) {})
}

// store writes w into both user tables; the caller holds mu.
func (d *memUserData) store(w leasecore.Write, now time.Time) {
	for _, t := range d.tables {
		t[[2]string{w.Scope, w.Part}] = leasecore.StoredPart{Scope: w.Scope, Part: w.Part, Content: w.Content,
			Writer: w.Writer, Token: w.Token, WrittenAt: now}
	}
}

func (d *memUserData) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	if err := checkScope(ctx, scope); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.floors[scope], nil
}

func (d *memUserData) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	rows, err := d.Rows(ctx, scope, part)
	if err != nil {
		return leasecore.StoredPart{}, false, err
	}
	return rows[0].Row, rows[0].Found, nil
}

func (d *memUserData) Rows(ctx context.Context, scope, part string) ([]conformance.UserRow, error) {
	if err := checkScope(ctx, scope); err != nil {
		return nil, err
	}
	if err := backendkit.CheckName("read part", "part", part); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var rows []conformance.UserRow
	for i, t := range d.tables {
		p, ok := t[[2]string{scope, part}]
		rows = append(rows, conformance.UserRow{Table: memUserTables[i], Found: ok, Row: p})
	}
	return rows, nil
}

func (d *memUserData) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	if err := checkScope(ctx, scope); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []leasecore.Attempt
	for _, a := range d.log {
		if a.Scope == scope {
			out = append(out, a)
		}
	}
	return out, nil
}

func checkScope(ctx context.Context, scope string) error {
	if err := backendkit.CheckName("read", "scope", scope); err != nil {
		return err
	}
	return backendkit.CheckContext("read", ctx)
}

// memMarkerFirst is the negative control: the marker through the part
// store (memfence's fence), the rows into the user tables with no fence.
type memMarkerFirst struct {
	*memUserData
	markers     conformance.Resource
	checksToken bool
}

var _ conformance.MarkerFirst = (*memMarkerFirst)(nil)

func (m *memMarkerFirst) Prepare(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	return m.markers.Write(ctx, w)
}

// Write stores the rows with no fence: the marker was the check, and it
// went stale while the writer was frozen. It keeps no floor (Floor 0), like
// the unfenced control. With checksToken set it is the broken control of
// the suite's own tests: it compares the token with the markers' floor
// after all, and the flaw cannot show.
func (m *memMarkerFirst) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	if m.checksToken {
		floor, err := m.markers.Floor(ctx, w.Scope)
		if err != nil || w.Token < floor {
			return leasecore.Result{Floor: floor}, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.store(w, time.Now())
	return leasecore.Result{Accepted: true}, nil
}

func (m *memMarkerFirst) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return m.markers.Floor(ctx, scope)
}

func (m *memMarkerFirst) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return m.markers.Attempts(ctx, scope)
}

func (h *memHarness) UserDataResource(_ context.Context, gap conformance.Gap) (conformance.UserResource, error) {
	return &memUser{memUserData: h.user, gap: gap}, nil
}

func (h *memHarness) MarkerFirstResource(context.Context) (conformance.MarkerFirst, error) {
	return &memMarkerFirst{memUserData: h.user, markers: h.res, checksToken: h.markerChecksToken}, nil
}
