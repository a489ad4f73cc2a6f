package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// Handoff latency after release: how long the lease stays without a leader
// when its leader steps down while others wait to lead.
//
// Every variant has -handoff-members campaigners (4 unless told) of one lease, each on a
// client of its own (its own pool, its own etcd client), as separate
// processes would be: one leads, the others wait. A sample is one step-down:
// the leader's lead function returns (for etcd's Election: the leader calls
// Resign), which is the start instant, taken in the lead function just
// before it returns, so the release itself is part of the handoff; the end
// instant is the first statement of the next leader's lead function (for
// Election: right after Campaign returned). Both are monotonic readings of
// this process. The leader that stepped down campaigns again only after the
// next leader leads, so every handoff goes to one of the others, and the
// next sample of that variant waits until it has been campaigning for
// handoffSettle (refused, and waiting again).
//
// The variants take turns sample by sample, in a new random order each
// turn, so a slow moment of the machine hits all of them; the 2 s poller
// takes a turn only now and then (each of its samples takes up to seconds).

const (
	// defaultHandoffMembers campaign for each variant's lease unless
	// -handoff-members says otherwise: one leads, the others wait.
	defaultHandoffMembers = 4
	// handoffTTL is every variant's lease TTL: client-go's default
	// LeaseDuration, whose default RetryPeriod is the poller's 2 s.
	handoffTTL = 15 * time.Second
	// handoffPoll is the poller's interval (client-go's RetryPeriod).
	handoffPoll = 2 * time.Second
	// handoffSettle is how long the former leader campaigns again (is
	// refused and waits) before its variant's next step-down.
	handoffSettle = 200 * time.Millisecond
	// handoffTimeout bounds one sample: far beyond any handoff, poll
	// included, but below the TTL a lost wake-up would cost.
	handoffTimeout = 10 * time.Second
)

// handoffPair is a RATIO line of the handoff phase: p50 of num over p50
// of den.
type handoffPair struct{ name, num, den string }

var handoffRatios = []handoffPair{
	{name: "handoff_p50_etcd_campaign/etcd_election", num: "etcd_campaign", den: "etcd_election"},
	{name: "handoff_p50_etcd_campaign_shared/etcd_election", num: "etcd_campaign_shared", den: "etcd_election"},
	{name: "handoff_p50_pg_campaign/poll_2s", num: "pg_campaign", den: "poll_2s"},
}

// handoffPGGoal is the goal for PostgreSQL's p50 handoff with LISTEN/NOTIFY.
const handoffPGGoal = 50 * time.Millisecond

// handoffMsRatio is the RATIO line that carries PostgreSQL's p50 in ms, an
// absolute figure like lab_wall_seconds.
const handoffMsRatio = "handoff_p50_ms_pg_campaign"

// term is one campaigner's turn: it waits until it leads, calls lead, and
// steps down (releases) when lead returns. It returns nil after a
// step-down.
type term func(ctx context.Context, lead func(ctx context.Context)) error

// contender is one campaigner of a variant.
type contender struct {
	id       int
	stepDown chan struct{} // the coordinator tells the leader to return from lead
	rejoin   chan struct{} // ... and the former leader to campaign again
}

type elected struct {
	c  *contender
	at time.Time
}

// contest is one variant: its campaigners and its samples.
type contest struct {
	name     string
	poll     bool // sampled only now and then
	election bool // etcd's Election, not leasecore.Campaign
	members  []*contender
	terms    []term
	elected  chan elected
	stepped  chan time.Time // the instant the leader's lead function returned
	errs     chan error
	retries  atomic.Int64 // CampaignRetry events: a Waiter that could not wait, an error that may pass
	lost     atomic.Int64 // CampaignLost events: a leader lost its lease while leading

	leader  *contender
	ready   time.Time // the next step-down not before
	samples []time.Duration
}

func newContest(name string, terms []term) *contest {
	c := &contest{name: name, terms: terms, elected: make(chan elected, len(terms)),
		stepped: make(chan time.Time, 1), errs: make(chan error, len(terms))}
	for i := range terms {
		c.members = append(c.members, &contender{id: i, stepDown: make(chan struct{}, 1), rejoin: make(chan struct{}, 1)})
	}
	return c
}

// observe counts the campaign events that say the measurement is not what
// it claims (a Waiter that fell back to polling, a lost lease).
func (c *contest) observe(ev leasecore.CampaignEvent) {
	switch ev.Kind {
	case leasecore.CampaignRetry:
		c.retries.Add(1)
	case leasecore.CampaignLost:
		c.lost.Add(1)
	}
}

// campaign runs member m until ctx ends: a term, then, once told to, the
// next.
func (c *contest) campaign(ctx context.Context, m *contender) {
	for {
		err := c.terms[m.id](ctx, func(lctx context.Context) {
			select {
			case c.elected <- elected{m, time.Now()}:
			case <-lctx.Done():
				return
			}
			select {
			case <-m.stepDown:
				c.stepped <- time.Now()
			case <-lctx.Done():
			}
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.errs <- fmt.Errorf("handoff %s: campaigner %d: %w", c.name, m.id, err)
			return
		}
		select {
		case <-m.rejoin:
		case <-ctx.Done():
			return
		}
	}
}

// start starts the campaigners and waits for the first leader.
func (c *contest) start(ctx context.Context, wg *sync.WaitGroup) error {
	for _, m := range c.members {
		wg.Go(func() { c.campaign(ctx, m) })
	}
	ev, err := c.next(ctx)
	if err != nil {
		return err
	}
	c.leader, c.ready = ev.c, time.Now().Add(handoffSettle)
	return nil
}

// next waits for the next leader.
func (c *contest) next(ctx context.Context) (elected, error) {
	t := time.NewTimer(handoffTimeout)
	defer t.Stop()
	select {
	case ev := <-c.elected:
		return ev, nil
	case err := <-c.errs:
		return elected{}, err
	case <-t.C:
		return elected{}, fmt.Errorf("handoff %s: no leader within %v", c.name, handoffTimeout)
	case <-ctx.Done():
		return elected{}, context.Cause(ctx)
	}
}

// sample steps the leader down and returns the time until the next one
// leads.
func (c *contest) sample(ctx context.Context) (time.Duration, error) {
	if d := time.Until(c.ready); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
	select {
	case ev := <-c.elected:
		return 0, fmt.Errorf("handoff %s: campaigner %d led without a step-down (lost leases: %d)", c.name, ev.c.id, c.lost.Load())
	case err := <-c.errs:
		return 0, err
	default:
	}
	old := c.leader
	old.stepDown <- struct{}{}
	var t0 time.Time
	select {
	case t0 = <-c.stepped:
	case err := <-c.errs:
		return 0, err
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	ev, err := c.next(ctx)
	if err != nil {
		return 0, err
	}
	if ev.c == old {
		return 0, fmt.Errorf("handoff %s: campaigner %d led again before it rejoined", c.name, old.id)
	}
	old.rejoin <- struct{}{}
	c.leader, c.ready = ev.c, time.Now().Add(handoffSettle)
	return ev.at.Sub(t0), nil
}

// handoffResult is one variant's samples.
type handoffResult struct {
	name    string
	samples []time.Duration
	retries int64 // -1: not a leasecore.Campaign (no retries to count)
}

func (r handoffResult) ms() []float64 {
	xs := make([]float64, len(r.samples))
	for i, d := range r.samples {
		xs[i] = float64(d.Nanoseconds()) / 1e6
	}
	return xs
}

// p50 and p99 in ms.
func (r handoffResult) p50() float64 { return median(r.ms()) }
func (r handoffResult) p99() float64 { return percentile(r.ms(), 0.99) }

// percentile is the nearest-rank p-quantile of xs (0 when empty).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

type handoffReport struct {
	samples, pollSamples, members int
	results                       []handoffResult
}

func (h handoffReport) byName(name string) handoffResult {
	for _, r := range h.results {
		if r.name == name {
			return r
		}
	}
	return handoffResult{name: name}
}

// pollTurn reports whether the poller takes part in turn t (1..samples):
// pollSamples turns spread evenly over samples.
func pollTurn(t, samples, pollSamples int) bool {
	return t*pollSamples/samples > (t-1)*pollSamples/samples
}

// handoff measures every variant, members campaigners each: a warm-up
// turn (not counted), then samples turns; the poller takes pollSamples of
// them.
func (e *env) handoff(ctx context.Context, samples, pollSamples, members int, say func(string, ...any)) (_ handoffReport, err error) {
	rep := handoffReport{samples: samples, pollSamples: pollSamples, members: members}
	if samples < 1 || pollSamples < 1 || pollSamples > samples {
		return rep, fmt.Errorf("handoff: %d samples, %d poll samples: want 1 <= poll samples <= samples", samples, pollSamples)
	}
	if members < 2 {
		return rep, fmt.Errorf("handoff: %d campaigners: want at least 2", members)
	}
	var closers []func() error
	defer func() {
		for _, c := range slices.Backward(closers) {
			err = errors.Join(err, c())
		}
	}()
	contests, cl, err := e.handoffContests(ctx, members)
	closers = append(closers, cl...)
	if err != nil {
		return rep, err
	}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Stop the campaigners (each releases what it holds) before the
	// clients close.
	closers = append(closers, func() error { cancel(); wg.Wait(); return nil })
	say("handoff: %d variants, %d campaigners each", len(contests), members)
	for _, c := range contests {
		if err := c.start(cctx, &wg); err != nil {
			return rep, err
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for t := 0; t <= samples; t++ {
		order := slices.Clone(contests)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, c := range order {
			if c.poll && t > 0 && !pollTurn(t, samples, pollSamples) {
				continue
			}
			d, err := c.sample(cctx)
			if err != nil {
				return rep, err
			}
			if t > 0 {
				c.samples = append(c.samples, d)
			}
		}
		if t%20 == 0 {
			say("handoff: turn %d/%d", t, samples)
		}
	}
	for _, c := range contests {
		r := handoffResult{name: c.name, samples: c.samples, retries: c.retries.Load()}
		if c.election {
			r.retries = -1
		}
		rep.results = append(rep.results, r)
	}
	return rep, nil
}

// handoffContests builds the variants. The closers close what was opened,
// also on error.
func (e *env) handoffContests(ctx context.Context, members int) (contests []*contest, closers []func() error, err error) {
	campaign := func(c **contest, lease leasecore.Lease, name, holder string, opts ...leasecore.CampaignOption) term {
		return func(ctx context.Context, lead func(context.Context)) error {
			opts := append([]leasecore.CampaignOption{
				leasecore.WithSessionOptions(leasecore.WithTTL(handoffTTL)),
				leasecore.WithCampaignObserver((*c).observe),
			}, opts...)
			return leasecore.Campaign(ctx, lease, name, holder, func(ctx context.Context, _ leasecore.Grant) error {
				lead(ctx)
				return nil
			}, opts...)
		}
	}
	pgStore := func() (*fencepg.LeaseStore, error) {
		// Two connections: one for WaitFree's LISTEN, one for the
		// session's acquire, renewals and release.
		cfg, err := pgxpool.ParseConfig(e.pg.cluster.DSN("bench_lease"))
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() error { pool.Close(); return nil })
		return fencepg.NewLeaseStore(pool)
	}
	dial := func() (*clientv3.Client, error) {
		cli, err := etcdconformance.Dial(ctx, e.etcd.srv.Endpoints())
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() error {
			if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		})
		return cli, nil
	}

	var pg, poll, etcdC, etcdS, elect *contest
	var pgTerms, pollTerms, etcdTerms, sharedTerms, electTerms []term
	for i := range members {
		holder := fmt.Sprintf("bench-%d", i)

		// PostgreSQL: the pgx LeaseStore waits with LISTEN/NOTIFY.
		s, err := pgStore()
		if err != nil {
			return nil, closers, err
		}
		pgTerms = append(pgTerms, campaign(&pg, s, "bench-handoff", holder))

		// The same store with its Waiter hidden: Campaign polls every 1-2 s.
		s, err = pgStore()
		if err != nil {
			return nil, closers, err
		}
		pollTerms = append(pollTerms, campaign(&poll, struct{ leasecore.Lease }{s}, "bench-handoff-poll", holder,
			leasecore.WithPollInterval(handoffPoll)))

		// etcd: the fence-etcd LeaseStore waits in line (AcquireQueued: the
		// release hands the lease over); default mode (an etcd lease per
		// holding period) and shared leases.
		for _, v := range []struct {
			c      **contest
			terms  *[]term
			prefix string
			opts   []fenceetcd.Option
		}{
			{&etcdC, &etcdTerms, "/bench/handoff", nil},
			{&etcdS, &sharedTerms, "/bench/handoff-shared", []fenceetcd.Option{fenceetcd.WithSharedLeases()}},
		} {
			cli, err := dial()
			if err != nil {
				return nil, closers, err
			}
			store, err := fenceetcd.NewLeaseStore(cli, append(v.opts, fenceetcd.WithPrefix(v.prefix))...)
			if err != nil {
				return nil, closers, err
			}
			closers = append(closers, store.Close)
			*v.terms = append(*v.terms, campaign(v.c, store, "bench-handoff", holder))
		}

		// etcd's own election, one session (etcd lease) per campaigner.
		cli, err := dial()
		if err != nil {
			return nil, closers, err
		}
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(handoffTTL/time.Second)))
		if err != nil {
			return nil, closers, err
		}
		closers = append(closers, sess.Close)
		el := concurrency.NewElection(sess, "/bench/handoff-election/")
		electTerms = append(electTerms, func(ctx context.Context, lead func(context.Context)) error {
			if err := el.Campaign(ctx, holder); err != nil {
				return err
			}
			lctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(sess.Ctx(), cancel) // the session's lease ended
			lead(lctx)
			stop()
			cancel()
			// Like Campaign's release: not cancelled by ctx, bounded.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), handoffTimeout)
			defer rcancel()
			return el.Resign(rctx)
		})
	}
	pg = newContest("pg_campaign", pgTerms)
	poll = newContest("poll_2s", pollTerms)
	poll.poll = true
	etcdC = newContest("etcd_campaign", etcdTerms)
	etcdS = newContest("etcd_campaign_shared", sharedTerms)
	elect = newContest("etcd_election", electTerms)
	elect.election = true
	return []*contest{pg, poll, etcdC, etcdS, elect}, closers, nil
}

// print writes the handoff table and the goal line.
func (h handoffReport) print(w io.Writer) {
	fmt.Fprintf(w, "\n# handoff latency after release: from the leader's lead function returning (etcd_election: the leader calling\n")
	fmt.Fprintf(w, "# Resign) to the next leader's lead function starting (etcd_election: its Campaign returning), release included;\n")
	fmt.Fprintf(w, "# %d campaigners per lease (1 leading, %d waiting), each on a client of its own, TTL %v; one step-down per sample,\n",
		h.members, h.members-1, handoffTTL)
	fmt.Fprintf(w, "# the former leader campaigns again once the next one leads. Waiting: pg_campaign leasecore.Campaign on the pgx\n")
	fmt.Fprintf(w, "# LeaseStore (LISTEN/NOTIFY); poll_2s the same with its Waiter hidden, WithPollInterval(%v); etcd_campaign Campaign\n", handoffPoll)
	fmt.Fprintf(w, "# on the fence-etcd LeaseStore (in line: the release hands the lease to the first waiter), _shared WithSharedLeases;\n")
	fmt.Fprintf(w, "# etcd_election concurrency.Election, a session each.\n")
	fmt.Fprintf(w, "# The variants take turns sample by sample, in a new random order each turn, after a warm-up turn; poll_2s takes\n")
	fmt.Fprintf(w, "# %d of the %d turns. p99: nearest rank (the largest sample below 100 samples); retries: Campaign retries after\n", h.pollSamples, h.samples)
	fmt.Fprintf(w, "# an error (a Waiter that could not wait polls), which should be 0 (-: not a Campaign)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "handoff\tp50 ms\tp99 ms\tmin\tmax\tsamples\tretries\t")
	for _, r := range h.results {
		xs := r.ms()
		lo, hi := 0.0, 0.0
		if len(xs) > 0 {
			lo, hi = slices.Min(xs), slices.Max(xs)
		}
		retries := "-"
		if r.retries >= 0 {
			retries = strconv.FormatInt(r.retries, 10)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%s\t\n", r.name, r.p50(), r.p99(), lo, hi, len(xs), retries)
	}
	tw.Flush()
	pg := h.byName("pg_campaign").p50()
	etcd := h.ratio(handoffRatios[0])
	fmt.Fprintf(w, "# handoff goals: pg_campaign p50 %.2f ms against the %d ms goal (%s); etcd_campaign p50 / etcd_election p50 %.2f\n",
		pg, handoffPGGoal.Milliseconds(), metIf(pg <= float64(handoffPGGoal.Milliseconds())), etcd)
	fmt.Fprintf(w, "# against the goal 1.00 (%s)\n", metIf(etcd <= 1))
}

func metIf(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// ratio is p50(num) / p50(den) (0 when den has none).
func (h handoffReport) ratio(p handoffPair) float64 {
	den := h.byName(p.den).p50()
	if den == 0 {
		return 0
	}
	return h.byName(p.num).p50() / den
}

// ratioLines writes the handoff's RATIO lines.
func (h handoffReport) ratioLines(w io.Writer) {
	for _, p := range handoffRatios {
		// Two decimals, or two significant digits for a small ratio
		// (PostgreSQL against the poller is about 0.005).
		v := h.ratio(p)
		format := "RATIO %s %.2f\n"
		if v < 0.1 {
			format = "RATIO %s %.2g\n"
		}
		fmt.Fprintf(w, format, p.name, v)
	}
	fmt.Fprintf(w, "RATIO %s %.2f\n", handoffMsRatio, h.byName("pg_campaign").p50())
}
