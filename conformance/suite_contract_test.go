package conformance_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// X2 must be able to fail: mutants of the in-memory lease service, each
// broken in one of the ways a lease service built on a lock (etcd's
// concurrency.Mutex) is broken, and each failing X2's check named for that
// way. Every mutant is memfence behind a client that does the wrong thing
// the way a real client library or server would; Inspect tells the truth,
// as the server's state.

// mutantHarness is the in-memory harness whose lease clients, OpenLease's
// and AmbiguousLease's, are clients of a broken lease service.
type mutantHarness struct {
	*memHarness
	m        *mutant
	clientOf newClient
}

// mutant is the state one broken lease service shares across its clients.
type mutant struct {
	leases *memfence.Leases
	stop   chan struct{} // closed when the harness closes: background work ends

	mu    sync.Mutex
	names map[string]bool // every name acquired (prefixNames)
}

// session is what a session-based client keeps of one holder: its TTL and
// the grants attached to it.
type session struct {
	ttl    time.Duration
	grants map[string]leasecore.Grant
}

// newClient makes one client of a broken service.
type newClient func(m *mutant) leasecore.Lease

func newMutantHarness(client newClient) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		m := h.(*memHarness)
		return &mutantHarness{memHarness: m, clientOf: client,
			m: &mutant{leases: m.leases, stop: make(chan struct{}), names: map[string]bool{}}}, nil
	}
}

func (h *mutantHarness) client() leasecore.Lease { return h.clientOf(h.m) }

func (h *mutantHarness) OpenLease(context.Context) (leasecore.Lease, error) { return h.client(), nil }

func (h *mutantHarness) AmbiguousLease(context.Context) (leasecore.Lease, func(), error) {
	l := &lossyLease{Lease: h.client()}
	return l, l.loseNextAnswer, nil
}

func (h *mutantHarness) Close() error {
	close(h.m.stop)
	return h.memHarness.Close()
}

// base is what every mutant client starts from: memfence's own operations
// and its honest Inspect. A mutant validates its input first, as memfence
// does, so that it breaks only what it is named for.
type base struct {
	leasecore.Lease
	leasecore.LeaseInspector
}

func baseOf(m *mutant) base { return base{m.leases, m.leases} }

// lost is the error a mutant's server gives for a grant that is not the
// current hold.
func lost(op string, g leasecore.Grant, reason string) error {
	return &leasecore.HoldError{Op: op, Name: g.Name, Holder: g.Holder, Token: g.Token, Reason: reason, Err: leasecore.ErrLost}
}

// current is the grant of whatever hold name has now, as a server that
// acts by name finds it; ok is false when nobody holds it.
func (b base) current(ctx context.Context, name string, ttl time.Duration) (leasecore.Grant, bool) {
	st, err := b.Inspect(ctx, name)
	if err != nil || !st.Held {
		return leasecore.Grant{}, false
	}
	return leasecore.Grant{Name: name, Holder: st.Holder, Token: st.Token, TTL: ttl}, true
}

// releaseByName is an unlock that deletes the lock's key by name: it ends
// whatever hold the name has, whoever holds it, and answers nil whether or
// not there was one (a delete of no key succeeds). It breaks X2's holds
// that are over (a release after expiry or after a take-over must fail
// with ErrLost) and its retried release (etcd issue #22082 in SOURCES.md).
type releaseByName struct{ base }

func (l releaseByName) Release(ctx context.Context, g leasecore.Grant) error {
	if err := backendkit.CheckGrant(ctx, "release", g, memfence.MinTTL); err != nil {
		return err
	}
	if cur, ok := l.current(ctx, g.Name, g.TTL); ok {
		return l.Lease.Release(ctx, cur)
	}
	return nil
}

// autoRenew renews every grant it hands out in the background, every third
// of its TTL, until it is released through this client: a session's
// keep-alive. A holder that stops calling Renew keeps its hold for as long
// as its process lives. Hole 4.
type autoRenew struct {
	base
	m *mutant

	mu   sync.Mutex
	done map[string]chan struct{} // by name: closed on release
}

func (l *autoRenew) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	if err != nil {
		return g, err
	}
	done := make(chan struct{})
	l.mu.Lock()
	l.done[name] = done
	l.mu.Unlock()
	go func() {
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-l.m.stop:
				return
			case <-done:
				return
			case <-t.C:
				if _, err := l.Lease.Renew(context.Background(), g); err != nil {
					return
				}
			}
		}
	}()
	return g, nil
}

func (l *autoRenew) Release(ctx context.Context, g leasecore.Grant) error {
	l.mu.Lock()
	if done, ok := l.done[g.Name]; ok {
		close(done)
		delete(l.done, g.Name)
	}
	l.mu.Unlock()
	return l.Lease.Release(ctx, g)
}

// reentrant is a re-entrant lock: the holder's acquire of a name it holds
// succeeds with the token it already has. Hole 5.
type reentrant struct{ base }

func (l reentrant) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	if errors.Is(err, leasecore.ErrHeld) {
		if cur, ok := l.current(ctx, name, ttl); ok && cur.Holder == holder {
			cur.Start = time.Now()
			return cur, nil
		}
	}
	return g, err
}

// sessionTTL attaches every name a holder acquires through this client to
// one session, as etcd's concurrency.Session does for the locks of one
// client: a grant carries the session's TTL, set by the holder's first
// acquire through the client, whatever TTL was asked for, and renewing any
// of the holder's names renews them all. Hole 3.
type sessionTTL struct {
	base

	mu       sync.Mutex
	sessions map[string]*session // by holder
}

func (l *sessionTTL) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, memfence.MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[holder]
	if s == nil {
		s = &session{ttl: ttl, grants: map[string]leasecore.Grant{}}
		l.sessions[holder] = s
	}
	g, err := l.Lease.Acquire(ctx, name, holder, s.ttl)
	if err == nil {
		s.grants[name] = g
	}
	return g, err
}

func (l *sessionTTL) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	if err := backendkit.CheckGrant(ctx, "renew", g, memfence.MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[g.Holder]
	if s == nil {
		return l.Lease.Renew(ctx, g)
	}
	g.TTL = s.ttl
	r, err := l.Lease.Renew(ctx, g)
	if err != nil {
		return r, err
	}
	for name, other := range s.grants { // the session's keep-alive
		if name != g.Name {
			if _, err := l.Lease.Renew(ctx, other); err != nil {
				delete(s.grants, name)
			}
		}
	}
	return r, nil
}

func (l *sessionTTL) Release(ctx context.Context, g leasecore.Grant) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sessions[g.Holder]; s != nil {
		delete(s.grants, g.Name)
	}
	return l.Lease.Release(ctx, g)
}

// prefixNames refuses an acquire while a name that begins with the name
// asked for is held, as a lock that looks for other holders with a prefix
// range read (Get(key, WithPrefix())) does. Hole 6.
type prefixNames struct {
	base
	m *mutant
}

func (l prefixNames) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, memfence.MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	for other := range l.m.names {
		if other != name && strings.HasPrefix(other, name) {
			if cur, ok := l.current(ctx, other, ttl); ok {
				return leasecore.Grant{}, &leasecore.HoldError{Op: "acquire", Name: name, Holder: holder,
					Reason: "held by " + cur.Holder + " under " + other, Err: leasecore.ErrHeld}
			}
		}
	}
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	if err == nil {
		l.m.names[name] = true
	}
	return g, err
}

// clientChecks checks the holder and token of a renewal or release only
// against the grants this client acquired; the server renews or releases
// by name whatever hold there is. Through the client that acquired, a
// non-holder is refused; through any other client it is not. Hole 7.
type clientChecks struct {
	base

	mu   sync.Mutex
	mine map[string]leasecore.Grant // by name: what this client acquired
}

func (l *clientChecks) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	if err == nil {
		l.mu.Lock()
		l.mine[name] = g
		l.mu.Unlock()
	}
	return g, err
}

// server is what the server gets: the current hold of g's name, after the
// client's own check of g against its bookkeeping.
func (l *clientChecks) server(ctx context.Context, op string, g leasecore.Grant) (leasecore.Grant, error) {
	if err := backendkit.CheckGrant(ctx, op, g, memfence.MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	l.mu.Lock()
	m, ok := l.mine[g.Name]
	l.mu.Unlock()
	if ok && (m.Holder != g.Holder || m.Token != g.Token) {
		return leasecore.Grant{}, lost(op, g, "not the grant this client acquired")
	}
	cur, held := l.current(ctx, g.Name, g.TTL)
	if !held {
		return leasecore.Grant{}, lost(op, g, "not held")
	}
	return cur, nil
}

func (l *clientChecks) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	cur, err := l.server(ctx, "renew", g)
	if err != nil {
		return leasecore.Grant{}, err
	}
	if _, err := l.Lease.Renew(ctx, cur); err != nil {
		return leasecore.Grant{}, err
	}
	g.Start = time.Now()
	return g, nil
}

func (l *clientChecks) Release(ctx context.Context, g leasecore.Grant) error {
	cur, err := l.server(ctx, "release", g)
	if err != nil {
		return err
	}
	l.mu.Lock()
	delete(l.mine, g.Name)
	l.mu.Unlock()
	return l.Lease.Release(ctx, cur)
}

// sessionGhosts keeps every hold it created in its holder's session, also
// one whose acquire's answer was lost, and renews the session's holds with
// each renewal of one of them: the caller never got that grant and will
// never release it, and it lives as long as the holder renews anything
// through this client. Hole 7 (a failed acquire's ghost).
type sessionGhosts struct {
	base

	mu     sync.Mutex
	ghosts []leasecore.Grant
}

func (l *sessionGhosts) answerLost(g leasecore.Grant) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ghosts = append(l.ghosts, g)
}

func (l *sessionGhosts) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	r, err := l.Lease.Renew(ctx, g)
	if err != nil {
		return r, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ghost := range l.ghosts {
		if ghost.Holder == g.Holder {
			_, _ = l.Lease.Renew(ctx, ghost)
		}
	}
	return r, nil
}

// doubledTTL holds every lease for twice the TTL asked for, while its
// grants say the TTL asked for. (The tightened expiry bound of waitFree.)
type doubledTTL struct{ base }

func (l doubledTTL) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, memfence.MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	g, err := l.Lease.Acquire(ctx, name, holder, 2*ttl)
	g.TTL = ttl
	return g, err
}

func (l doubledTTL) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	if err := backendkit.CheckGrant(ctx, "renew", g, memfence.MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	d := g
	d.TTL = 2 * g.TTL
	r, err := l.Lease.Renew(ctx, d)
	r.TTL = g.TTL
	return r, err
}

// The mutants, each with the FAIL lines of X2 (and, for doubledTTL, of the
// cases that wait for an expiry) it must print: the check named for what
// it breaks, not just any failure.
var mutants = []struct {
	name   string
	client newClient
	cases  []string
	want   []string
}{
	{
		name:   "release by name only",
		client: func(m *mutant) leasecore.Lease { return releaseByName{baseOf(m)} },
		cases:  []string{"X2"},
		want: []string{
			"  FAIL [I1] holder-a's release after its hold expired, nobody having taken over, fails with ErrLost and changes nothing (expected=ErrLost; free, actual=nil; free)",
			"  FAIL [I1] holder-a's release of its expired grant, after holder-b took over, fails with ErrLost; holder-b's hold is unaffected (expected=ErrLost; held by holder-b token=2, actual=nil; free)",
			"  FAIL [I1] holder-b's second release fails with ErrLost and changes nothing (expected=ErrLost; free, actual=nil; free)",
			"  FAIL [I1] holder-a's retried release (its first release took effect, its answer was lost) fails with ErrLost; holder-b's hold is unaffected (expected=ErrLost; held by holder-b token=2, actual=nil; free)",
			"  FAIL [I1] holder-c's acquire after the retry is refused with ErrHeld: holder-b still holds the lease (expected=ErrHeld; held by holder-b token=2, actual=granted token=3; held by holder-c token=3)",
		},
	},
	{
		name: "background auto-renew",
		client: func(m *mutant) leasecore.Lease {
			return &autoRenew{base: baseOf(m), m: m, done: map[string]chan struct{}{}}
		},
		cases: []string{"X2"},
		want: []string{
			"  FAIL [TTL] holder-a's hold of x2-idle, alive and not frozen, its client open and in use, but never renewed, ends by the backend's clock within ttl + granularity + bound of its acquire (expected=free within 575ms (ttl 300ms + granularity 0s + bound 275ms), actual=still held after ",
		},
	},
	{
		name:   "re-entrant acquire returning the old token",
		client: func(m *mutant) leasecore.Lease { return reentrant{baseOf(m)} },
		cases:  []string{"X2"},
		want: []string{
			"  FAIL [I1] holder-a's second acquire of a name it already holds is refused with ErrHeld and changes nothing (expected=ErrHeld; held by holder-a token=1, actual=granted token=1; held by holder-a token=1)",
			"  FAIL [I1] holder-a's acquire of a name it already holds, through a second client, is refused with ErrHeld and changes nothing (expected=ErrHeld; held by holder-a token=1, actual=granted token=1; held by holder-a token=1)",
		},
	},
	{
		name:   "shared TTL per holder",
		client: func(m *mutant) leasecore.Lease { return &sessionTTL{base: baseOf(m), sessions: map[string]*session{}} },
		cases:  []string{"X2"},
		want: []string{
			"  FAIL [TTL] holder-a's grant of x2-ttl-short, its second name, carries the TTL asked for, not the first name's (expected=ttl=300ms, actual=ttl=1.2s)",
			"  FAIL [TTL] holder-a's hold of x2-ttl-short, not renewed while holder-a renews x2-ttl-long every 75ms, ends by the backend's clock within ttl + granularity + bound of its acquire (expected=free within 575ms (ttl 300ms + granularity 0s + bound 275ms), actual=still held after ",
		},
	},
	{
		name:   "prefix-matching names",
		client: func(m *mutant) leasecore.Lease { return prefixNames{baseOf(m), m} },
		cases:  []string{"X2"},
		want: []string{
			`  FAIL [I1] names that prefix one another or differ by case or a LIKE wildcard ("a/b", "a", "a/b/c", "a/", "ab", "a%", "a_", "A") are acquired while the others are held, each by its own holder (expected=8 of 8 acquired, actual=6 of 8 acquired; refused "a" by holder-2: ErrHeld, "a/" by holder-4: ErrHeld)`,
		},
	},
	{
		name: "client-side-only holder checks",
		client: func(m *mutant) leasecore.Lease {
			return &clientChecks{base: baseOf(m), mine: map[string]leasecore.Grant{}}
		},
		cases: []string{"X2"},
		want: []string{
			"  FAIL [I1] renewal by a non-holder (holder-b with holder-a's token) through a second client fails with ErrLost and changes nothing (expected=ErrLost; held by holder-a token=1, actual=nil; held by holder-a token=1)",
			"  FAIL [I1] release by a non-holder (holder-b with holder-a's token) through a second client fails with ErrLost and changes nothing (expected=ErrLost; held by holder-a token=1, actual=nil; free)",
		},
	},
	{
		name:   "ghost holder on a failed acquire",
		client: func(m *mutant) leasecore.Lease { return &sessionGhosts{base: baseOf(m)} },
		cases:  []string{"X2"},
		want: []string{
			"  FAIL [TTL] x2-ghost, acquired by holder-g with the answer lost, while holder-g renews x2-keep through the same client every 75ms, ends by the backend's clock within ttl + granularity + bound of that acquire (expected=free within 575ms (ttl 300ms + granularity 0s + bound 275ms), actual=still held after ",
		},
	},
	{
		name:   "doubled TTL",
		client: func(m *mutant) leasecore.Lease { return doubledTTL{baseOf(m)} },
		cases:  []string{"F7", "X2"},
		want: []string{
			"  FAIL [TTL] holder-a's hold of daily-report-f7-row, never renewed, ends by the backend's clock within ttl + granularity + bound of its acquire (expected=free within 575ms (ttl 300ms + granularity 0s + bound 275ms), actual=free after ",
			"  FAIL [TTL] holder-a's hold of x2-idle, alive and not frozen, its client open and in use, but never renewed, ends by the backend's clock within ttl + granularity + bound of its acquire (expected=free within 575ms (ttl 300ms + granularity 0s + bound 275ms), actual=free after ",
		},
	},
}

func TestSuiteFailsBrokenLeaseServices(t *testing.T) {
	t.Parallel()
	// The mutants run at once, in goroutines of this one test rather than
	// as parallel subtests: they mostly wait for leases to lapse, and
	// parallel subtests would queue behind the suite's other parallel
	// tests for go test's few parallel slots.
	type result struct {
		sum conformance.Summary
		out string
		err error
	}
	results := make([]result, len(mutants))
	var wg sync.WaitGroup
	for i, mt := range mutants {
		wg.Go(func() {
			var out strings.Builder
			sum, err := conformance.Report(t.Context(), &out, newMutantHarness(mt.client), conformance.ReportOptions{Cases: mt.cases})
			results[i] = result{sum, out.String(), err}
		})
	}
	wg.Wait()
	for i, mt := range mutants {
		t.Run(mt.name, func(t *testing.T) {
			r := results[i]
			if r.err != nil {
				t.Fatalf("Report: %v", r.err)
			}
			wantLines(t, r.sum, r.out, mt.want...)
		})
	}
}

// A mutant client that does nothing wrong passes X2: the mutant harness
// itself (a new client per OpenLease, lossyLease over it) is not what
// fails the mutants above.
func TestX2PassesTheMutantHarnessWithAnHonestClient(t *testing.T) {
	t.Parallel()
	sum, out := report(t, newMutantHarness(func(m *mutant) leasecore.Lease { return baseOf(m) }), "X2")
	if sum.Failed != 0 || sum.Passed == 0 || strings.Contains(out, "  skip ") {
		t.Errorf("passed=%d failed=%d:\n%s", sum.Passed, sum.Failed, out)
	}
}

// withoutAmbiguity is the in-memory harness without AmbiguousOutcomes,
// declaring it absent when reason is set.
type withoutAmbiguity struct {
	conformance.Harness // hides memHarness's optional methods
	reason              string
}

func (h withoutAmbiguity) Traits() conformance.Traits {
	t := h.Harness.Traits()
	if h.reason != "" {
		t.Absent[conformance.AbilityAmbiguousOutcomes] = h.reason
	}
	return t
}

// X2's lost-answer sections skip, printing why, for a harness that
// declares AmbiguousOutcomes absent, and fail for one that neither
// implements nor declares it; the other sections run in both.
func TestX2WithoutAmbiguousOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reason, want string
		failed       int
	}{
		{"no proxy in front of this server", "  skip ambiguous outcomes: no proxy in front of this server", 0},
		{"", "  FAIL the harness neither implements *conformance.AmbiguousOutcomes (ambiguous outcomes) nor declares it absent in Traits.Absent", 2},
	} {
		sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
			h, _ := newMemHarness(ctx)
			return withoutAmbiguity{h, tc.reason}, nil
		}, "X2")
		if n := strings.Count(out, tc.want); n != 2 {
			t.Errorf("%q printed %d times, want 2 (retried release, lost acquire answer):\n%s", tc.want, n, out)
		}
		if sum.Failed != tc.failed || !strings.Contains(out, "  -- second client\n  ok   ") {
			t.Errorf("failed=%d (want %d), or the other sections did not run:\n%s", sum.Failed, tc.failed, out)
		}
	}
}
