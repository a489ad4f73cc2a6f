package leasecore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Campaign makes holder the leader of lease name whenever it can, and runs
// lead while it is: it acquires a Session (waiting while another holder has
// the lease), calls lead with a context and the session's grant, and
// releases the lease when lead returns.
//
// The context lead gets is derived from ctx and is also cancelled when the
// session ends, at its local deadline (even while a renewal hangs) or when a
// renewal finds the hold lost; context.Cause then says why (an error
// wrapping ErrLocalDeadline or ErrLost). Every write lead makes must carry
// the grant's token, as g.Claim(scope) does (token space included, see
// Claim.Space): the resource's check of it is what keeps a leader that was
// paused past its lease from writing, not the context. g is the grant as
// acquired: its Name, Holder, Token, TTL and Space hold while lead runs; its
// Start is the acquire's (renewals do not move it).
//
// When the session ended before lead returned, Campaign campaigns again
// (a new session, a larger token), whatever lead returned. When lead
// returns while still leading, Campaign releases the lease and returns
// lead's result: a leader that should lead for good blocks until its
// context ends; a job that is done returns nil (a job that should run once,
// and not at all while another instance holds the lease, calls Run).
//
// While another holder has the lease (ErrHeld), Campaign waits in line when
// the Lease can hand a lease over at release (backendkit.QueuedAcquirer:
// fence-etcd's LeaseStore), else with the Lease's WaitFree when it has one,
// else polls (WithPollInterval). Errors that
// may pass (ErrUnavailable, ErrLost, ErrLocalDeadline, an acquire that took
// longer than ttl - margin) are retried after an exponential backoff with
// jitter (WithBackoff). Any other error cannot heal by retrying: Campaign
// returns it — ErrInvalidArgument, ErrSchema (run the migration), and
// ErrConfig, a misconfigured backend (an unknown database or role, failed
// authentication, a missing grant, a server that is not crash-safe): the
// configuration must change before any attempt can succeed, and a
// deployment meets it at start-up from the backend's start-up check
// (fencepg's Preflight) rather than in the campaign.
//
// Campaign returns context.Cause(ctx) once ctx ends, after lead returned and
// the lease was released. It starts no goroutine that outlives it.
func Campaign(ctx context.Context, lease Lease, name, holder string,
	lead func(ctx context.Context, g Grant) error, opts ...CampaignOption) error {
	c, err := newCampaign(lease, name, holder, lead, opts)
	if err != nil {
		return err
	}
	return c.run(ctx)
}

// CampaignOption configures Campaign.
type CampaignOption func(*campaignConfig)

type campaignConfig struct {
	session                []SessionOption
	poll                   time.Duration
	backoffMin, backoffMax time.Duration
	pollSet, backoffSet    bool
	observe                func(CampaignEvent)
}

// WithSessionOptions sets the options of each Session the campaign
// acquires (TTL, margin, renew interval, clock, ...). The campaign waits
// and backs off on the same clock.
func WithSessionOptions(opts ...SessionOption) CampaignOption {
	return func(c *campaignConfig) { c.session = append(c.session, opts...) }
}

// WithPollInterval sets how often a campaign retries Acquire while another
// holder has the lease and the Lease has no WaitFree (default TTL/8: about the
// 2 s client-go retries with its default 15 s lease). Each pause is random,
// between half of d and d.
func WithPollInterval(d time.Duration) CampaignOption {
	return func(c *campaignConfig) { c.poll, c.pollSet = d, true }
}

// WithBackoff sets the pauses after an error that may pass: the first is
// about minimum, each next one twice the last, at most maximum; each is
// random between half of that and all of it. The default is poll interval/4
// up to TTL/2.
func WithBackoff(minimum, maximum time.Duration) CampaignOption {
	return func(c *campaignConfig) { c.backoffMin, c.backoffMax, c.backoffSet = minimum, maximum, true }
}

// WithCampaignObserver adds a function called with each CampaignEvent, from
// the goroutine that called Campaign. It must not block: the campaign waits
// for it (the session keeps renewing, but lead starts, and the lease is
// released, only after it returned). Each call adds one (your own and a
// metrics collector's, say); they run in the order given. A nil f is
// ignored.
func WithCampaignObserver(f func(CampaignEvent)) CampaignOption {
	return func(c *campaignConfig) { c.observe = chain(c.observe, f) }
}

// CampaignEventKind says what happened to a campaign.
type CampaignEventKind int

const (
	// CampaignElected: the campaign acquired the lease (Token) and is about
	// to call lead.
	CampaignElected CampaignEventKind = iota + 1
	// CampaignLost: the session ended while lead ran (Err wraps ErrLost or
	// ErrLocalDeadline); the campaign campaigns again unless ctx ended.
	CampaignLost
	// CampaignResigned: lead returned while leading (or ctx ended) and the
	// lease was released; Err is the release's error, if any.
	CampaignResigned
	// CampaignObserved: another holder has the lease (Holder, Token). Sent
	// when the Lease is a LeaseInspector, once per holding period seen.
	CampaignObserved
	// CampaignRetry: an error that may pass (Err); the next attempt follows
	// after Delay.
	CampaignRetry
)

var campaignEventNames = [...]string{"", "elected", "lost", "resigned", "observed", "retry"}

func (k CampaignEventKind) String() string {
	if k > 0 && int(k) < len(campaignEventNames) {
		return campaignEventNames[k]
	}
	return fmt.Sprintf("CampaignEventKind(%d)", int(k))
}

// CampaignEvent reports one step of a campaign to WithCampaignObserver.
type CampaignEvent struct {
	Kind   CampaignEventKind
	Name   string
	Holder string // the campaign's holder; for CampaignObserved the other one
	Token  Token  // the campaign's token; for CampaignObserved the other holder's
	Err    error
	Delay  time.Duration // CampaignRetry: the pause before the next attempt
}

type campaign struct {
	lease        Lease
	queue        queuedAcquirer // lease, when it can wait in line; else nil
	name, holder string
	lead         func(context.Context, Grant) error
	cfg          campaignConfig
	sess         sessionConfig

	lastSeen LeaseState // the other holding period last reported as observed
}

func newCampaign(lease Lease, name, holder string, lead func(context.Context, Grant) error,
	opts []CampaignOption) (*campaign, error) {
	const op = "campaign"
	var cfg campaignConfig
	for _, o := range opts {
		o(&cfg)
	}
	sess, err := newSessionConfig(op, lease, cfg.session)
	if err != nil {
		return nil, err
	}
	if lead == nil {
		return nil, &ArgError{Op: op, Field: "lead", Reason: "must not be nil"}
	}
	if !cfg.pollSet {
		cfg.poll = sess.ttl / 8
	}
	if !cfg.backoffSet {
		cfg.backoffMin, cfg.backoffMax = cfg.poll/4, sess.ttl/2
	}
	bad := func(field string, v time.Duration, reason string) error {
		return &ArgError{Op: op, Field: field, Value: v.String(), Reason: reason}
	}
	switch {
	case cfg.poll <= 0:
		return nil, bad("poll interval", cfg.poll, "must be positive")
	case cfg.backoffMin <= 0:
		return nil, bad("backoff minimum", cfg.backoffMin, "must be positive")
	case cfg.backoffMax < cfg.backoffMin:
		return nil, bad("backoff maximum", cfg.backoffMax, fmt.Sprintf("must not be below the minimum %v", cfg.backoffMin))
	}
	queue, _ := lease.(queuedAcquirer)
	return &campaign{lease: lease, queue: queue, name: name, holder: holder, lead: lead, cfg: cfg, sess: sess}, nil
}

func (c *campaign) emit(ev CampaignEvent) {
	if c.cfg.observe != nil {
		ev.Name = c.name
		if ev.Holder == "" {
			ev.Holder = c.holder
		}
		c.cfg.observe(ev)
	}
}

var (
	errAcquireTimeout = fmt.Errorf("leasecore: campaign: acquire took longer than ttl - margin: %w", ErrUnavailable)
	errWaitCap        = errors.New("leasecore: campaign: waited one ttl")
)

// mayPass reports whether a campaign retries after err.
func mayPass(err error) bool {
	return errors.Is(err, ErrHeld) || errors.Is(err, ErrLost) ||
		errors.Is(err, ErrUnavailable) || errors.Is(err, ErrLocalDeadline)
}

func (c *campaign) run(ctx context.Context) error {
	var backoff time.Duration
	queued := false // refused: wait in line (a backendkit.QueuedAcquirer)
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		sess, err := c.newSession(ctx, queued)
		queued = false
		if err == nil {
			backoff = 0
			if done, err := c.leadOnce(ctx, sess); done {
				return err
			}
			continue
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		switch {
		case errors.Is(err, ErrHeld):
			backoff = 0
			c.observeHolder(ctx)
			if c.queue != nil {
				queued = true // the holder's release hands the lease over
				continue
			}
			if !c.waitFree(ctx) {
				return context.Cause(ctx)
			}
		case mayPass(err):
			backoff = min(max(2*backoff, c.cfg.backoffMin), c.cfg.backoffMax)
			d := jitter(backoff)
			c.emit(CampaignEvent{Kind: CampaignRetry, Err: err, Delay: d})
			if !sleep(ctx, c.sess.clock, d) {
				return context.Cause(ctx)
			}
		default:
			return err
		}
	}
}

// newSession acquires a session: with one Acquire, or, queued, waiting in
// line until the lease is handed over or free (AcquireQueued bounds its own
// wait).
func (c *campaign) newSession(ctx context.Context, queued bool) (*Session, error) {
	if queued {
		return newQueuedSession(ctx, c.queue, c.lease, c.name, c.holder, c.sess)
	}
	// An acquire that takes longer than ttl - margin gives an unusable
	// grant anyway: give up on it then and try again.
	actx, cancel := withClockTimeout(ctx, c.sess.clock, c.sess.ttl-c.sess.margin, errAcquireTimeout)
	defer cancel()
	sess, err := NewSession(actx, c.lease, c.name, c.holder, c.cfg.session...)
	if err != nil && errors.Is(context.Cause(actx), errAcquireTimeout) {
		err = fmt.Errorf("%w (%w)", errAcquireTimeout, err)
	}
	return sess, err
}

// leadOnce runs lead under sess and releases the lease afterwards. done
// reports that the campaign is over, with err its result.
func (c *campaign) leadOnce(ctx context.Context, sess *Session) (done bool, err error) {
	g := sess.Grant()
	token := g.Token
	// The release does not inherit ctx's end (ctx may be why lead returned)
	// but is bounded like every request of the session's own.
	closeSession := func() error {
		rctx, rcancel := withClockTimeout(context.WithoutCancel(ctx), c.sess.clock, c.sess.renewTimeout, errReleaseTimeout)
		defer rcancel()
		return sess.Close(rctx)
	}
	closed := false
	defer func() {
		if !closed {
			// lead (or an observer) panicked: end the session and release
			// the lease before the panic goes on, so a caller that
			// recovers is not left holding a lease nobody leads under.
			_ = closeSession()
		}
	}()
	c.emit(CampaignEvent{Kind: CampaignElected, Token: token})
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fired := make(chan struct{})
	stop := context.AfterFunc(sess.Context(), func() {
		cancel(context.Cause(sess.Context()))
		close(fired)
	})
	defer stop()
	leadErr := c.lead(lctx, g)
	if !stop() {
		<-fired // the AfterFunc goroutine is done too: none outlives Campaign
	}
	cancel(nil)

	ended := sess.Err() // nil: lead returned while the session still ran
	closed = true
	closeErr := closeSession()
	if ended != nil {
		c.emit(CampaignEvent{Kind: CampaignLost, Token: token, Err: ended})
		if ctx.Err() != nil {
			return true, context.Cause(ctx)
		}
		return false, nil
	}
	c.emit(CampaignEvent{Kind: CampaignResigned, Token: token, Err: closeErr})
	if ctx.Err() != nil {
		return true, context.Cause(ctx)
	}
	return true, leadErr
}

// observeHolder reports the holder that refused us, when somebody listens
// and the Lease can say who it is.
func (c *campaign) observeHolder(ctx context.Context) {
	in, ok := c.lease.(LeaseInspector)
	if !ok || c.cfg.observe == nil {
		return
	}
	ictx, cancel := withClockTimeout(ctx, c.sess.clock, c.sess.renewTimeout, errReleaseTimeout)
	st, err := in.Inspect(ictx, c.name)
	cancel()
	if err != nil || !st.Held || (st.Holder == c.lastSeen.Holder && st.Token == c.lastSeen.Token) {
		return
	}
	c.lastSeen = st
	c.emit(CampaignEvent{Kind: CampaignObserved, Holder: st.Holder, Token: st.Token})
}

// waitFree waits until the lease may be free: with the Lease's Waiter,
// bounded by one TTL, or by one poll. It returns false when ctx ended.
func (c *campaign) waitFree(ctx context.Context) bool {
	if w, ok := c.lease.(freeWaiter); ok {
		wctx, cancel := withClockTimeout(ctx, c.sess.clock, c.sess.ttl, errWaitCap)
		err := w.WaitFree(wctx, c.name)
		capped := errors.Is(context.Cause(wctx), errWaitCap)
		cancel()
		switch {
		case ctx.Err() != nil:
			return false
		case err == nil || capped:
			return true
		}
		// The Waiter cannot wait now: poll this once.
		d := jitter(c.cfg.poll)
		c.emit(CampaignEvent{Kind: CampaignRetry, Err: err, Delay: d})
		return sleep(ctx, c.sess.clock, d)
	}
	return sleep(ctx, c.sess.clock, jitter(c.cfg.poll))
}
