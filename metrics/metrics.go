// Package leasefencemetrics provides Prometheus collectors for leasefence's
// sessions, campaigns and fences, registered on a registry the caller
// passes, fed by leasecore's and the backends' observer options.
//
// Nothing is measured unless the caller asks for it twice: New registers
// the collectors on the caller's registry (never the global default), and
// each session, campaign and fence to be measured gets the matching
// observer:
//
//	reg := prometheus.NewRegistry()         // or prometheus.DefaultRegisterer, deliberately
//	m, err := leasefencemetrics.New(reg)
//	sess, err := leasecore.NewSession(ctx, leases, "nightly-invoices", instance,
//		leasecore.WithSessionObserver(m.ObserveSession))
//	fence, err := fencepg.NewFence(appPool, fencepg.WithFenceObserver(m.ObserveFence))
//	err = leasecore.Campaign(ctx, leases, "invoice-leader", instance, lead,
//		leasecore.WithCampaignObserver(m.ObserveCampaign),
//		leasecore.WithSessionOptions(leasecore.WithSessionObserver(m.ObserveSession)))
//
// The metrics, all counters but the histogram and the gauge:
//
//	leasefence_acquires_total{name, outcome}            acquires by NewSession (and Campaign):
//	                                                     outcome "acquired", "held" (another holder has it)
//	                                                     or "failed"
//	leasefence_renew_duration_seconds{name}              histogram of successful renewals' round trips
//	leasefence_renew_failures_total{name}                renewal attempts that failed (a later one may
//	                                                     still keep the lease)
//	leasefence_losses_total{name, reason}                sessions that ended other than by Close: reason
//	                                                     "lost" (the hold was over: expired, taken over)
//	                                                     or "local_deadline" (no renewal in time)
//	leasefence_local_deadline_remaining_seconds{name}    gauge, computed at each scrape: time left before
//	                                                     the local deadline of this process's session on
//	                                                     the lease (0 once passed); absent while none runs
//	leasefence_fenced_writes_total{scope, outcome}       fenced writes by outcome "accepted" or "rejected"
//	                                                     (a stale holder cut off by the fence)
//	leasefence_token_space_rejections_total{scope}       rejections by a floor from another lease service
//	                                                     (also counted as rejected above): a
//	                                                     misconfiguration, see leasecore.ErrTokenSpace
//	leasefence_handoffs_total{name, direction}           campaign leadership changes of this process:
//	                                                     "in" (elected), "out" (lost or resigned)
//
// Label values are lease names and scopes: their number is the number of
// leases and scopes the process uses. For a namespace prefix or constant
// labels (instance, job), wrap the registerer
// (prometheus.WrapRegistererWithPrefix, prometheus.WrapRegistererWith).
// The Observe methods are safe for concurrent use and do not block; they
// are meant to be passed as method values to the observer options.
package leasefencemetrics

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefence/leasefence/leasecore"
)

// Metrics is the set of collectors New registered.
type Metrics struct {
	acquires      *prometheus.CounterVec
	renewSeconds  *prometheus.HistogramVec
	renewFailures *prometheus.CounterVec
	losses        *prometheus.CounterVec
	deadlines     *deadlines
	writes        *prometheus.CounterVec
	tokenSpace    *prometheus.CounterVec
	handoffs      *prometheus.CounterVec
}

// renewBuckets are the renew histogram's buckets, in seconds: 1 ms to about
// 8 s, doubling. A renewal that takes a sizeable part of the TTL is the
// thing to see (docs/choosing-numbers.md derives the margin from it).
var renewBuckets = prometheus.ExponentialBuckets(0.001, 2, 14)

// New makes the collectors and registers them on reg. It fails, registering
// nothing, when reg is nil (a *leasecore.ArgError) or refuses one of them
// (already registered: call New once per registry).
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, &leasecore.ArgError{Op: "new metrics", Field: "registerer", Reason: "must not be nil"}
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "leasefence", Name: name, Help: help}, labels)
	}
	m := &Metrics{
		acquires: counter("acquires_total",
			`Lease acquires by this process's sessions, by outcome: "acquired", "held" (another holder has the lease) or "failed".`,
			"name", "outcome"),
		renewSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "leasefence", Name: "renew_duration_seconds",
			Help:    "Round trip of successful background renewals, by the session's clock.",
			Buckets: renewBuckets}, []string{"name"}),
		renewFailures: counter("renew_failures_total",
			"Background renewal attempts that failed; a later attempt may still keep the lease.", "name"),
		losses: counter("losses_total",
			`Sessions that ended other than by Close, by reason: "lost" (the hold was over: expired or taken over) or "local_deadline" (no renewal succeeded in time).`,
			"name", "reason"),
		deadlines: &deadlines{
			desc: prometheus.NewDesc("leasefence_local_deadline_remaining_seconds",
				"Time left before the local deadline of this process's session on the lease (0 once passed): how long the holder may still start work without another renewal.",
				[]string{"name"}, nil),
			held: map[string]heldLease{},
		},
		writes: counter("fenced_writes_total",
			`Fenced writes by outcome: "accepted", or "rejected" (the token was below the scope's floor: a stale holder cut off).`,
			"scope", "outcome"),
		tokenSpace: counter("token_space_rejections_total",
			"Fenced writes rejected by a floor that a token from another lease service set (also counted as rejected): a scope fenced by two lease services.",
			"scope"),
		handoffs: counter("handoffs_total",
			`Campaign leadership changes of this process: "in" (elected) or "out" (lost or resigned).`,
			"name", "direction"),
	}
	cs := []prometheus.Collector{m.acquires, m.renewSeconds, m.renewFailures, m.losses, m.deadlines,
		m.writes, m.tokenSpace, m.handoffs}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("leasefencemetrics: register: %w", err)
		}
	}
	return m, nil
}

// ObserveSession counts one session event; pass it to
// leasecore.WithSessionObserver (for a Campaign, inside
// leasecore.WithSessionOptions).
func (m *Metrics) ObserveSession(ev leasecore.SessionEvent) {
	name := ev.Grant.Name
	switch ev.Kind {
	case leasecore.SessionAcquired:
		m.acquires.WithLabelValues(name, "acquired").Inc()
		m.deadlines.set(ev.Grant, ev.Deadline, true)
	case leasecore.SessionAcquireFailed:
		outcome := "failed"
		if errors.Is(ev.Err, leasecore.ErrHeld) {
			outcome = "held"
		}
		m.acquires.WithLabelValues(name, outcome).Inc()
	case leasecore.SessionRenewed:
		m.renewSeconds.WithLabelValues(name).Observe(ev.Latency.Seconds())
		m.deadlines.set(ev.Grant, ev.Deadline, false)
	case leasecore.SessionRenewFailed:
		m.renewFailures.WithLabelValues(name).Inc()
	case leasecore.SessionEnded:
		m.deadlines.drop(ev.Grant)
		switch {
		case errors.Is(ev.Err, leasecore.ErrLost):
			m.losses.WithLabelValues(name, "lost").Inc()
		case errors.Is(ev.Err, leasecore.ErrLocalDeadline):
			m.losses.WithLabelValues(name, "local_deadline").Inc()
		}
	}
}

// ObserveCampaign counts handoffs; pass it to
// leasecore.WithCampaignObserver.
func (m *Metrics) ObserveCampaign(ev leasecore.CampaignEvent) {
	switch ev.Kind {
	case leasecore.CampaignElected:
		m.handoffs.WithLabelValues(ev.Name, "in").Inc()
	case leasecore.CampaignLost, leasecore.CampaignResigned:
		m.handoffs.WithLabelValues(ev.Name, "out").Inc()
	}
}

// ObserveFence counts one fenced write; pass it to fencepg.WithFenceObserver
// or fenceetcd.WithFenceObserver.
func (m *Metrics) ObserveFence(ev leasecore.FenceEvent) {
	scope := ev.Claim.Scope
	if ev.Result.Accepted {
		m.writes.WithLabelValues(scope, "accepted").Inc()
		return
	}
	m.writes.WithLabelValues(scope, "rejected").Inc()
	if errors.Is(ev.Err, leasecore.ErrTokenSpace) {
		m.tokenSpace.WithLabelValues(scope).Inc()
	}
}

// deadlines is the local-deadline gauge: the deadline of the session each
// lease name has in this process, turned into time left at each scrape, so
// the value is current between renewals.
type deadlines struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	held map[string]heldLease
}

type heldLease struct {
	token    leasecore.Token
	deadline time.Time
}

// set records the deadline of g's holding period: always for a new one
// (acquired), only while it is still recorded for a renewal — one that is
// reported after its session's end must not bring it back.
func (d *deadlines) set(g leasecore.Grant, deadline time.Time, acquired bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.held[g.Name]; acquired || (ok && h.token == g.Token) {
		d.held[g.Name] = heldLease{token: g.Token, deadline: deadline}
	}
}

// drop forgets g's holding period, unless a newer one of the name replaced
// it already.
func (d *deadlines) drop(g leasecore.Grant) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.held[g.Name]; ok && h.token == g.Token {
		delete(d.held, g.Name)
	}
}

func (d *deadlines) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *deadlines) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, h := range d.held {
		// time.Until uses the deadline's monotonic reading (sessions on
		// the process's clock, leasecore's default), unaffected by wall-clock steps.
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, max(time.Until(h.deadline), 0).Seconds(), name)
	}
}
