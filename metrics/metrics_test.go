package leasefencemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
	leasefencemetrics "github.com/leasefence/leasefence/metrics"
)

// Short real-time parameters: the sessions run on the system clock against
// the in-memory lease service.
const (
	ttl      = 600 * time.Millisecond
	interval = 50 * time.Millisecond
	margin   = 100 * time.Millisecond
)

func newMetrics(t *testing.T) (*prometheus.Registry, *leasefencemetrics.Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := leasefencemetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, m
}

func sessionOptions(m *leasefencemetrics.Metrics, extra ...leasecore.SessionOption) []leasecore.SessionOption {
	return append([]leasecore.SessionOption{leasecore.WithTTL(ttl), leasecore.WithRenewInterval(interval),
		leasecore.WithMargin(margin), leasecore.WithSessionObserver(m.ObserveSession)}, extra...)
}

// eventually polls cond every 10 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

func TestNew(t *testing.T) {
	if _, err := leasefencemetrics.New(nil); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("New(nil) = %v, want ErrInvalidArgument", err)
	}
	reg, _ := newMetrics(t)
	if _, err := leasefencemetrics.New(reg); err == nil {
		t.Error("New on a registry that has the collectors already: nil error")
	}
	// The failed second New left the first one's collectors in place.
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("series before any event: %d, %v; want 0 (no series until something happens)", n, err)
	}
	// When the registry refuses one collector, New takes back the ones it
	// had registered.
	rec := &recorder{Registerer: prometheus.NewRegistry(), live: map[prometheus.Collector]bool{}}
	clash := prometheus.NewCounter(prometheus.CounterOpts{Name: "leasefence_handoffs_total", Help: "taken"})
	rec.MustRegister(clash)
	if _, err := leasefencemetrics.New(rec); err == nil {
		t.Fatal("New with a clashing collector: nil error")
	}
	if len(rec.live) != 1 || !rec.live[clash] {
		t.Errorf("after the refused New %d collectors are registered, want only the clashing one", len(rec.live))
	}
}

// recorder is a Registerer that keeps track of what is registered.
type recorder struct {
	prometheus.Registerer
	live map[prometheus.Collector]bool
}

func (r *recorder) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	if err == nil {
		r.live[c] = true
	}
	return err
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c prometheus.Collector) bool {
	delete(r.live, c)
	return r.Registerer.Unregister(c)
}

// A session's life in the metrics: the acquire, renewals in the histogram,
// the time left before the local deadline (present while it runs, gone
// after Close), a held acquire of a second holder, and no loss for Close.
func TestSessionMetrics(t *testing.T) {
	reg, m := newMetrics(t)
	leases := memfence.NewLeases(nil)
	ctx := context.Background()
	s, err := leasecore.NewSession(ctx, leases, "report-job", "holder-a", sessionOptions(m)...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := leasecore.NewSession(ctx, leases, "report-job", "holder-b", sessionOptions(m)...); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("holder-b: %v, want ErrHeld", err)
	}
	eventually(t, "three renewals", func() bool {
		return histogramCount(t, reg, "leasefence_renew_duration_seconds") >= 3
	})

	want := `
# HELP leasefence_acquires_total Lease acquires by this process's sessions, by outcome: "acquired", "held" (another holder has the lease) or "failed".
# TYPE leasefence_acquires_total counter
leasefence_acquires_total{name="report-job",outcome="acquired"} 1
leasefence_acquires_total{name="report-job",outcome="held"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasefence_acquires_total"); err != nil {
		t.Error(err)
	}
	left := value(t, reg, "leasefence_local_deadline_remaining_seconds", "name", "report-job")
	if left <= 0 || left > (ttl-margin).Seconds() {
		t.Errorf("time left before the local deadline = %vs, want in (0, %v]", left, ttl-margin)
	}

	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "leasefence_local_deadline_remaining_seconds"); n != 0 {
		t.Errorf("deadline gauge after Close: %d series, want none", n)
	}
	if n := testutil.CollectAndCount(reg, "leasefence_losses_total"); n != 0 {
		t.Errorf("losses after Close: %d series, want none (a close is no loss)", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// histogramCount returns the sample count of the histogram name (one
// series) in reg.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// value returns the counter or gauge name{labels...} (name, value pairs)
// in reg, failing if there is no such series.
func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, mt := range mf.GetMetric() {
			if len(mt.GetLabel()) != len(want) {
				continue
			}
			for _, l := range mt.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			if c := mt.GetCounter(); c != nil {
				return c.GetValue()
			}
			return mt.GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, want)
	return 0
}

// failingRenewals makes every renewal of the lease fail as unavailable
// while down is set.
type failingRenewals struct {
	*memfence.Leases
	down atomic.Bool
}

func (f *failingRenewals) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	if f.down.Load() {
		return leasecore.Grant{}, fmt.Errorf("test: connection refused: %w", leasecore.ErrUnavailable)
	}
	return f.Leases.Renew(ctx, g)
}

// Losses by reason: a hold released by someone else is "lost" at the next
// renewal; renewals that keep failing end at the local deadline, counted
// as failures first.
func TestLossMetrics(t *testing.T) {
	reg, m := newMetrics(t)
	ctx := context.Background()
	leases := &failingRenewals{Leases: memfence.NewLeases(nil)}

	lost, err := leasecore.NewSession(ctx, leases, "lost-job", "holder-a", sessionOptions(m)...)
	if err != nil {
		t.Fatal(err)
	}
	defer lost.Close(ctx)
	if err := leases.Release(ctx, lost.Grant()); err != nil { // an operator's break, say
		t.Fatal(err)
	}
	<-lost.Done()
	// Done closes before the observer hears of the end; Close waits for
	// the renewal goroutine, which reports it.
	lost.Close(ctx)

	leases.down.Store(true)
	late, err := leasecore.NewSession(ctx, leases, "late-job", "holder-a", sessionOptions(m)...)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close(ctx)
	<-late.Done()
	if !errors.Is(late.Err(), leasecore.ErrLocalDeadline) {
		t.Fatalf("late session: %v, want ErrLocalDeadline", late.Err())
	}
	late.Close(ctx)

	want := `
# HELP leasefence_losses_total Sessions that ended other than by Close, by reason: "lost" (the hold was over: expired or taken over) or "local_deadline" (no renewal succeeded in time).
# TYPE leasefence_losses_total counter
leasefence_losses_total{name="late-job",reason="local_deadline"} 1
leasefence_losses_total{name="lost-job",reason="lost"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasefence_losses_total"); err != nil {
		t.Error(err)
	}
	// ttl - margin = 500 ms of attempts every 50 ms: several failed.
	if n := value(t, reg, "leasefence_renew_failures_total", "name", "late-job"); n < 3 {
		t.Errorf("renew failures of late-job = %v, want several", n)
	}
	if n := value(t, reg, "leasefence_renew_failures_total", "name", "lost-job"); n != 1 {
		t.Errorf("renew failures of lost-job = %v, want 1 (the renewal that found the hold lost)", n)
	}
	if n := testutil.CollectAndCount(reg, "leasefence_local_deadline_remaining_seconds"); n != 0 {
		t.Errorf("deadline gauge after both ended: %d series, want none", n)
	}
}

// Fenced writes by scope and outcome, rejections by a floor from another
// token space counted as such too — from the in-memory resource's results.
func TestFenceMetrics(t *testing.T) {
	reg, m := newMetrics(t)
	ctx := context.Background()
	res := memfence.NewResource()
	write := func(scope string, token leasecore.Token) {
		t.Helper()
		w := leasecore.Write{Scope: scope, Part: "p", Content: "x", Writer: "w", Token: token}
		r, err := res.Write(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		m.ObserveFence(leasecore.FenceEvent{Op: "write", Claim: backendkit.ClaimOf(w), Result: r})
	}
	write("invoices", 1)
	write("invoices", 2)
	write("invoices", 1)
	write("reports", 5)
	c := leasecore.Claim{Scope: "reports", Writer: "w", Token: 3, Space: "postgres:a"}
	m.ObserveFence(leasecore.FenceEvent{Op: "commit", Claim: c, Result: leasecore.Result{Floor: 5},
		Err: backendkit.TokenSpaceMismatch("commit", c, 5, "etcd:b")})

	want := `
# HELP leasefence_fenced_writes_total Fenced writes by outcome: "accepted", or "rejected" (the token was below the scope's floor: a stale holder cut off).
# TYPE leasefence_fenced_writes_total counter
leasefence_fenced_writes_total{outcome="accepted",scope="invoices"} 2
leasefence_fenced_writes_total{outcome="accepted",scope="reports"} 1
leasefence_fenced_writes_total{outcome="rejected",scope="invoices"} 1
leasefence_fenced_writes_total{outcome="rejected",scope="reports"} 1
# HELP leasefence_token_space_rejections_total Fenced writes rejected by a floor that a token from another lease service set (also counted as rejected): a scope fenced by two lease services.
# TYPE leasefence_token_space_rejections_total counter
leasefence_token_space_rejections_total{scope="reports"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"leasefence_fenced_writes_total", "leasefence_token_space_rejections_total"); err != nil {
		t.Error(err)
	}
}

// Handoffs: a campaign elected and resigning is one in, one out; a second
// campaign that takes over after it is one more in.
func TestHandoffMetrics(t *testing.T) {
	reg, m := newMetrics(t)
	leases := memfence.NewLeases(nil)
	ctx := context.Background()
	lead := func(context.Context, leasecore.Grant) error { return nil }
	for _, holder := range []string{"holder-a", "holder-b"} {
		if err := leasecore.Campaign(ctx, leases, "leader", holder, lead,
			leasecore.WithCampaignObserver(m.ObserveCampaign),
			leasecore.WithSessionOptions(sessionOptions(m)...)); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP leasefence_handoffs_total Campaign leadership changes of this process: "in" (elected) or "out" (lost or resigned).
# TYPE leasefence_handoffs_total counter
leasefence_handoffs_total{direction="in",name="leader"} 2
leasefence_handoffs_total{direction="out",name="leader"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasefence_handoffs_total"); err != nil {
		t.Error(err)
	}
	if n := value(t, reg, "leasefence_acquires_total", "name", "leader", "outcome", "acquired"); n != 2 {
		t.Errorf("acquires of the campaigns' sessions = %v, want 2", n)
	}
}

// A renewal reported after its session's end (Close gave up waiting for an
// answer that then came) does not bring the deadline gauge back; a newer
// holding period of the name is not dropped by an older one's end.
func TestDeadlineGaugeOrder(t *testing.T) {
	reg, m := newMetrics(t)
	g1 := leasecore.Grant{Name: "job", Holder: "a", Token: 1}
	g2 := leasecore.Grant{Name: "job", Holder: "a", Token: 2}
	soon := time.Now().Add(time.Minute)
	m.ObserveSession(leasecore.SessionEvent{Kind: leasecore.SessionAcquired, Grant: g1, Deadline: soon})
	m.ObserveSession(leasecore.SessionEvent{Kind: leasecore.SessionEnded, Grant: g1, Err: leasecore.ErrClosed})
	m.ObserveSession(leasecore.SessionEvent{Kind: leasecore.SessionRenewed, Grant: g1, Deadline: soon})
	if n := testutil.CollectAndCount(reg, "leasefence_local_deadline_remaining_seconds"); n != 0 {
		t.Errorf("a renewal after the end brought the gauge back (%d series)", n)
	}
	m.ObserveSession(leasecore.SessionEvent{Kind: leasecore.SessionAcquired, Grant: g2, Deadline: soon})
	m.ObserveSession(leasecore.SessionEvent{Kind: leasecore.SessionEnded, Grant: g1, Err: leasecore.ErrLost})
	if left := value(t, reg, "leasefence_local_deadline_remaining_seconds", "name", "job"); left < 50 || left > 60 {
		t.Errorf("token 2's time left = %vs after token 1's late end, want about 60s", left)
	}
	past := time.Now().Add(-time.Second)
	m.ObserveSession(leasecore.SessionEvent{Kind: leasecore.SessionRenewed, Grant: g2, Deadline: past})
	if left := value(t, reg, "leasefence_local_deadline_remaining_seconds", "name", "job"); left != 0 {
		t.Errorf("time left past the deadline = %v, want 0", left)
	}
}
