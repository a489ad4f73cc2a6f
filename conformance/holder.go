package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// RunHolder is the holder process of F4, F5 and F12: the report job's
// instance as a separate OS process, driven by its parent one line at a
// time. It reads commands from in and answers on out, until EXIT or the end
// of in:
//
//	ACQUIRE <name> <holder> <ttl> <renew-interval> <margin>
//	    -> ACQUIRED token=N | NOT_ACQUIRED <reason>
//	    starts a leasecore.Session: background renewal, local deadline
//	CHECK
//	    -> READY_TO_WRITE token=N | NOT_VALID <reason>
//	    the pre-write check; the parent freezes the process right after it
//	PREPARE <scope> <part> <content...>
//	    -> PREPARED accepted=B token=N floor=F | PREPARED none
//	    the first step of a two-step write (Preparer, the marker-first
//	    control); "none" for a resource whose write is one step
//	WRITE <scope> <part> <content...>
//	    -> WRITE accepted=B token=N floor=F
//	    writes at once, with no further check: the write is the very next
//	    thing the holder does, as in the paused-holder timeline
//	WRITE_FROZEN <scope> <part> <content...>
//	    -> IN_TX token=N, later WRITE accepted=B token=N floor=F
//	    the write of a user-data holder, stopped inside its atomic
//	    operation (InTransaction): after its first statement it answers
//	    IN_TX and waits for SIGCONT — the parent freezes it with SIGSTOP
//	    first — then runs one more statement, the rest of the write and
//	    its commit, and answers as WRITE does (F18)
//	WRITE_AND_RENEW <scope> <part> <content...>
//	    -> WRITE ... then RENEW_AFTER_WRITE ok=true | RENEW_AFTER_WRITE ok=false err=<sentinel>
//	    (err=ErrLost, or whatever else the renewal failed with)
//	RENEW
//	    -> RENEW ok=B token=N
//	RELEASE
//	    -> RELEASED ok=B
//	RELAY <url>
//	    -> RELAYED delivered=N
//	    one pass of the outbox relay of a KindOutbox holder (OutboxRelay):
//	    every pending entry POSTed as JSON to the downstream at url, each
//	    marked delivered only after the downstream answered; F9b kills the
//	    process with SIGKILL while the downstream holds a request
//	EXIT
//
// F12 runs the holder as a leader instead, with leasecore.Campaign in the
// background (no ACQUIRE in the same process). Times are Unix nanoseconds
// by this process's clock, which the parent on the same machine compares
// with its own:
//
//	CAMPAIGN <name> <holder> <ttl> <renew-interval> <margin>
//	    -> LEADING token=N deadline=D granted=G | CAMPAIGN_ENDED err=<sentinel>
//	    starts the campaign and answers once it is elected. D is the
//	    session's local deadline, after which the lead context ends (an
//	    estimate no earlier than the session's own until the first renewal,
//	    exact afterwards); G is when the winning Acquire returned. The lead
//	    function blocks until its context ends or STEP_DOWN.
//	AWAIT_LEADING
//	    -> LEADING ... | CAMPAIGN_ENDED err=<sentinel>
//	    the campaign's next election (after a lost term the campaign goes on)
//	DEADLINE
//	    -> DEADLINE token=N deadline=D
//	    the current term's local deadline; it moves with every renewal
//	AWAIT_LEAD_END
//	    -> LEAD_ENDED token=N deadline=D at=T cause=<sentinel>
//	    the next end of a lead context: context.Cause's sentinel
//	    (ErrLocalDeadline, ErrLost), the local deadline the term had then,
//	    and when the lead function saw its context end
//	STEP_DOWN
//	    -> CAMPAIGN_ENDED err=<sentinel>
//	    the lead function returns nil; Campaign releases the lease and
//	    returns, and the answer carries its result. Send it while leading.
//	WRITE <scope> <part> <content...>
//	    while campaigning, writes with the latest term's token, with no
//	    check: after a lost term that token is stale, and the stale write
//	    is what F12 shows the resource rejecting
//
// Background renewals, elections and ends of lead contexts are reported as
// they happen, as lines starting with "EVENT ". Errors are answered with
// "ERROR <text>" and end nothing. A backend's test binary runs RunHolder
// when re-executed as a holder (see HolderProcesses), and so does the lab
// with its holder subcommand.
func RunHolder(ctx context.Context, lease leasecore.Lease, res leasecore.FencedResource, in io.Reader, out io.Writer) error {
	h := &holderProcess{lease: lease, res: res, out: out}
	defer h.closeSession(context.WithoutCancel(ctx))
	defer h.stopCampaign()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), backendkit.MaxContentLen+1024)
	for sc.Scan() {
		cmd, rest, _ := strings.Cut(sc.Text(), " ")
		if cmd == "EXIT" {
			return nil
		}
		if err := h.do(ctx, cmd, rest); err != nil {
			h.say("ERROR %s: %v", cmd, err)
		}
	}
	return sc.Err()
}

type holderProcess struct {
	lease leasecore.Lease
	res   leasecore.FencedResource

	outMu sync.Mutex
	out   io.Writer

	sess *leasecore.Session
	camp *holderCampaign
}

// say writes one line; the renewal goroutine writes too.
func (h *holderProcess) say(format string, args ...any) {
	h.outMu.Lock()
	defer h.outMu.Unlock()
	fmt.Fprintf(h.out, format+"\n", args...)
}

func (h *holderProcess) do(ctx context.Context, cmd, rest string) error {
	switch cmd {
	case "ACQUIRE":
		return h.acquire(ctx, strings.Fields(rest))
	case "CAMPAIGN":
		return h.campaign(ctx, strings.Fields(rest))
	case "AWAIT_LEADING", "DEADLINE", "AWAIT_LEAD_END", "STEP_DOWN":
		if h.camp == nil {
			return errors.New("no campaign: CAMPAIGN first")
		}
		return h.camp.do(ctx, cmd)
	case "CHECK":
		s, err := h.session()
		if err != nil {
			return err
		}
		if s.Valid() {
			h.say("READY_TO_WRITE token=%d", s.Token())
		} else {
			h.say("NOT_VALID %v", s.Err())
		}
	case "PREPARE":
		w, err := h.parseWrite(cmd, rest)
		if err != nil {
			return err
		}
		p, ok := h.res.(Preparer)
		if !ok {
			h.say("PREPARED none")
			return nil
		}
		r, err := p.Prepare(ctx, w)
		if err != nil {
			return err
		}
		h.say("PREPARED accepted=%t token=%d floor=%d", r.Accepted, w.Token, r.Floor)
	case "WRITE_FROZEN":
		w, err := h.parseWrite(cmd, rest)
		if err != nil {
			return err
		}
		r, err := h.res.Write(withInTransaction(ctx, h.frozenInTx), w)
		if err != nil {
			return err
		}
		h.say("WRITE accepted=%t token=%d floor=%d", r.Accepted, w.Token, r.Floor)
	case "WRITE", "WRITE_AND_RENEW":
		if cmd == "WRITE_AND_RENEW" && h.sess == nil {
			return errors.New("no session: ACQUIRE first")
		}
		w, err := h.parseWrite("WRITE", rest)
		if err != nil {
			return err
		}
		r, err := h.res.Write(ctx, w)
		if err != nil {
			return err
		}
		h.say("WRITE accepted=%t token=%d floor=%d", r.Accepted, w.Token, r.Floor)
		if cmd == "WRITE_AND_RENEW" {
			if _, err := h.lease.Renew(ctx, h.sess.Grant()); err != nil {
				// The sentinel, so the parent can tell "the lease moved
				// on" (ErrLost) from a dropped connection.
				h.say("RENEW_AFTER_WRITE ok=false err=%s", errKind(err))
			} else {
				h.say("RENEW_AFTER_WRITE ok=true")
			}
		}
	case "RENEW":
		s, err := h.session()
		if err != nil {
			return err
		}
		g, err := h.lease.Renew(ctx, s.Grant())
		h.say("RENEW ok=%t token=%d", err == nil, g.Token)
	case "RELAY":
		return h.relay(ctx, rest)
	case "RELEASE":
		if _, err := h.session(); err != nil {
			return err
		}
		err := h.closeSession(ctx)
		h.say("RELEASED ok=%t", err == nil)
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	return nil
}

// parseWrite parses "<scope> <part> <content...>" into a write with the
// session's holder and token, or the campaign's latest.
func (h *holderProcess) parseWrite(cmd, rest string) (leasecore.Write, error) {
	var g leasecore.Grant
	if h.camp != nil {
		g = h.camp.grant()
	} else {
		s, err := h.session()
		if err != nil {
			return leasecore.Write{}, err
		}
		g = s.Grant()
	}
	f := strings.SplitN(rest, " ", 3)
	if len(f) < 2 {
		return leasecore.Write{}, fmt.Errorf("want: %s <scope> <part> <content>", cmd)
	}
	content := ""
	if len(f) == 3 {
		content = f[2]
	}
	return leasecore.Write{Scope: f[0], Part: f[1], Content: content, Writer: g.Holder, Token: g.Token}, nil
}

// terms are a session's terms as ACQUIRE and CAMPAIGN take them.
type terms struct{ ttl, margin time.Duration }

// parseTerms reads "<name> <holder> <ttl> <renew-interval> <margin>
// [<renew-timeout>]" (the fields after cmd) and returns the terms and the
// session options they give.
func parseTerms(cmd string, f []string) (terms, []leasecore.SessionOption, error) {
	if len(f) != 5 && len(f) != 6 {
		return terms{}, nil, fmt.Errorf("want: %s <name> <holder> <ttl> <renew-interval> <margin> [<renew-timeout>]", cmd)
	}
	var d [4]time.Duration
	for i, s := range f[2:] {
		var err error
		if d[i], err = time.ParseDuration(s); err != nil {
			return terms{}, nil, err
		}
	}
	opts := []leasecore.SessionOption{leasecore.WithTTL(d[0]), leasecore.WithRenewInterval(d[1]), leasecore.WithMargin(d[2])}
	if len(f) == 6 {
		opts = append(opts, leasecore.WithRenewTimeout(d[3]))
	}
	return terms{ttl: d[0], margin: d[2]}, opts, nil
}

func (h *holderProcess) acquire(ctx context.Context, f []string) error {
	if h.sess != nil || h.camp != nil {
		return errors.New("already holding a session or campaigning")
	}
	_, opts, err := parseTerms("ACQUIRE", f)
	if err != nil {
		return err
	}
	opts = append(opts, leasecore.WithRenewObserver(func(ev leasecore.RenewEvent) {
		if ev.Err != nil {
			h.say("EVENT RENEWED ok=false %v", ev.Err)
			return
		}
		// start: the wall clock when the renewal was sent, for the parent
		// to freeze this process before the next one
		// (freezeBetweenRenewals).
		h.say("EVENT RENEWED ok=true token=%d start=%d", ev.Grant.Token, ev.Start.UnixNano())
	}))
	s, err := leasecore.NewSession(ctx, h.lease, f[0], f[1], opts...)
	if errors.Is(err, leasecore.ErrHeld) {
		h.say("NOT_ACQUIRED %v", err)
		return nil
	}
	if err != nil {
		return err
	}
	h.sess = s
	h.say("ACQUIRED token=%d", s.Token())
	return nil
}

func (h *holderProcess) session() (*leasecore.Session, error) {
	if h.sess == nil {
		return nil, errors.New("no session: ACQUIRE first")
	}
	return h.sess, nil
}

func (h *holderProcess) closeSession(ctx context.Context) error {
	if h.sess == nil {
		return nil
	}
	err := h.sess.Close(ctx)
	return err
}

// holderCampaign is a holder process's leasecore.Campaign (CAMPAIGN). The
// campaign's goroutines report to the command loop over channels; the
// loop answers the parent's commands from them.
type holderCampaign struct {
	h           *holderProcess
	holder      string
	ttl, margin time.Duration
	net         *netLease // stamps the Acquires, for the deadline estimate and G

	cancel   context.CancelFunc
	stepDown chan struct{} // closed by STEP_DOWN
	stepOnce sync.Once
	terms    chan holderTerm    // each election, in order
	ends     chan holderLeadEnd // each end of a lead context, in order
	done     chan struct{}      // closed when Campaign returned
	err      error              // Campaign's result, once done is closed

	mu       sync.Mutex
	token    leasecore.Token // the latest term's
	deadline time.Time       // the latest term's local deadline
}

type holderTerm struct {
	token             leasecore.Token
	deadline, granted time.Time
}

type holderLeadEnd struct {
	token        leasecore.Token
	cause        error
	deadline, at time.Time
}

func (h *holderProcess) campaign(ctx context.Context, f []string) error {
	if h.sess != nil || h.camp != nil {
		return errors.New("already holding a session or campaigning")
	}
	t, sessOpts, err := parseTerms("CAMPAIGN", f)
	if err != nil {
		return err
	}
	n, lease := wrapNet(h.lease)
	cctx, cancel := context.WithCancel(ctx)
	hc := &holderCampaign{h: h, holder: f[1], ttl: t.ttl, margin: t.margin, net: n, cancel: cancel,
		stepDown: make(chan struct{}),
		terms:    make(chan holderTerm, 16), ends: make(chan holderLeadEnd, 16), done: make(chan struct{})}
	h.camp = hc
	go func() {
		defer close(hc.done)
		hc.err = leasecore.Campaign(cctx, lease, f[0], f[1], hc.lead,
			leasecore.WithSessionOptions(append(sessOpts, leasecore.WithRenewObserver(hc.renewed))...))
	}()
	return hc.do(ctx, "AWAIT_LEADING")
}

// lead is the campaign's function: it leads until its context ends or the
// parent says STEP_DOWN, doing nothing meanwhile; the parent's WRITE
// commands are its work.
func (hc *holderCampaign) lead(ctx context.Context, g leasecore.Grant) error {
	token := g.Token
	st := hc.net.acquired(token)
	hc.mu.Lock()
	if hc.token != token {
		// Until the first renewal reports the session's own deadline, use
		// the Acquire's send time: it is later than the reading the session
		// took before the same request, so the estimate is never earlier
		// than the real deadline.
		hc.token, hc.deadline = token, st.sent.Add(hc.ttl-hc.margin)
	}
	deadline := hc.deadline
	hc.mu.Unlock()
	hc.h.say("EVENT LEADING token=%d", token)
	hc.terms <- holderTerm{token, deadline, st.returned}
	select {
	case <-hc.stepDown:
		return nil
	case <-ctx.Done():
	}
	at := time.Now()
	cause := context.Cause(ctx)
	hc.mu.Lock()
	deadline = hc.deadline
	hc.mu.Unlock()
	hc.h.say("EVENT LEAD_ENDED token=%d cause=%s", token, causeKind(cause))
	hc.ends <- holderLeadEnd{token, cause, deadline, at}
	return cause
}

// renewed tracks the session's local deadline, which only its renewals
// report.
func (hc *holderCampaign) renewed(ev leasecore.RenewEvent) {
	if ev.Err != nil {
		hc.h.say("EVENT RENEWED ok=false %v", ev.Err)
		return
	}
	hc.mu.Lock()
	if ev.Grant.Token == hc.token {
		hc.deadline = ev.Deadline
	}
	hc.mu.Unlock()
	hc.h.say("EVENT RENEWED ok=true token=%d", ev.Grant.Token)
}

// grant is what a WRITE carries: the latest term's holder and token.
func (hc *holderCampaign) grant() leasecore.Grant {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return leasecore.Grant{Holder: hc.holder, Token: hc.token}
}

func (hc *holderCampaign) do(ctx context.Context, cmd string) error {
	ended := func() { hc.h.say("CAMPAIGN_ENDED err=%s", causeKind(hc.err)) }
	switch cmd {
	case "AWAIT_LEADING":
		select {
		case t := <-hc.terms:
			hc.h.say("LEADING token=%d deadline=%d granted=%d", t.token, t.deadline.UnixNano(), t.granted.UnixNano())
		case <-hc.done:
			ended()
		case <-ctx.Done():
			return ctx.Err()
		}
	case "DEADLINE":
		hc.mu.Lock()
		token, deadline := hc.token, hc.deadline
		hc.mu.Unlock()
		hc.h.say("DEADLINE token=%d deadline=%d", token, deadline.UnixNano())
	case "AWAIT_LEAD_END":
		select {
		case e := <-hc.ends:
			hc.h.say("LEAD_ENDED token=%d deadline=%d at=%d cause=%s", e.token, e.deadline.UnixNano(), e.at.UnixNano(), causeKind(e.cause))
		case <-hc.done:
			ended()
		case <-ctx.Done():
			return ctx.Err()
		}
	case "STEP_DOWN":
		hc.stepOnce.Do(func() { close(hc.stepDown) })
		select {
		case <-hc.done:
			ended()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// stopCampaign ends a campaign still running when the holder exits:
// Campaign releases the lease before it returns.
func (h *holderProcess) stopCampaign() {
	if h.camp == nil {
		return
	}
	h.camp.cancel()
	<-h.camp.done
}

// causeKind is errKind that also names ErrLocalDeadline, the cause of a
// lead context that ended at the session's local deadline.
func causeKind(err error) string {
	if errors.Is(err, leasecore.ErrLocalDeadline) {
		return "ErrLocalDeadline"
	}
	return errKind(err)
}

// frozenInTx is WRITE_FROZEN's hook inside the write: it says IN_TX,
// waits for the parent's SIGCONT (after its SIGSTOP), and runs one more
// statement, so the write goes on with statements after the freeze and is
// decided only at its commit.
func (h *holderProcess) frozenInTx(ctx context.Context, w leasecore.Write, stmt TxStatement) error {
	wait := notifyContinued(ctx, frozenInTxLimit)
	h.say("IN_TX token=%d", w.Token)
	if err := wait(); err != nil {
		return fmt.Errorf("frozen inside the write: %w", err)
	}
	return stmt(ctx)
}

// frozenInTxLimit bounds WRITE_FROZEN's wait for SIGCONT: a parent that
// died leaves no holder waiting for ever.
const frozenInTxLimit = 5 * time.Minute
