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
)

// RunHolder is the holder process of F4 and F5: the report job's instance
// as a separate OS process, driven by its parent one line at a time. It
// reads commands from in and answers on out, until EXIT or the end of in:
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
//	WRITE_AND_RENEW <scope> <part> <content...>
//	    -> WRITE ... then RENEW_AFTER_WRITE ok=true | RENEW_AFTER_WRITE ok=false err=<sentinel>
//	    (err=ErrLost, or whatever else the renewal failed with)
//	RENEW
//	    -> RENEW ok=B token=N
//	RELEASE
//	    -> RELEASED ok=B
//	EXIT
//
// Background renewals are reported as they happen, as lines starting with
// "EVENT ". Errors are answered with "ERROR <text>" and end nothing. A
// backend's test binary runs RunHolder when re-executed as a holder (see
// HolderProcesses), and so does the lab with its holder subcommand.
func RunHolder(ctx context.Context, lease leasecore.Lease, res leasecore.FencedResource, in io.Reader, out io.Writer) error {
	h := &holderProcess{lease: lease, res: res, out: out}
	defer h.closeSession(context.WithoutCancel(ctx))
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), leasecore.MaxContentLen+1024)
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
	case "WRITE", "WRITE_AND_RENEW":
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
// session's holder and token.
func (h *holderProcess) parseWrite(cmd, rest string) (leasecore.Write, error) {
	s, err := h.session()
	if err != nil {
		return leasecore.Write{}, err
	}
	f := strings.SplitN(rest, " ", 3)
	if len(f) < 2 {
		return leasecore.Write{}, fmt.Errorf("want: %s <scope> <part> <content>", cmd)
	}
	content := ""
	if len(f) == 3 {
		content = f[2]
	}
	g := s.Grant()
	return leasecore.Write{Scope: f[0], Part: f[1], Content: content, Writer: g.Holder, Token: g.Token}, nil
}

func (h *holderProcess) acquire(ctx context.Context, f []string) error {
	if h.sess != nil {
		return errors.New("already holding a session")
	}
	if len(f) != 5 {
		return errors.New("want: ACQUIRE <name> <holder> <ttl> <renew-interval> <margin>")
	}
	var d [3]time.Duration
	for i, s := range f[2:] {
		var err error
		if d[i], err = time.ParseDuration(s); err != nil {
			return err
		}
	}
	s, err := leasecore.NewSession(ctx, h.lease, f[0], f[1],
		leasecore.WithTTL(d[0]), leasecore.WithRenewInterval(d[1]), leasecore.WithMargin(d[2]),
		leasecore.WithRenewObserver(func(ev leasecore.RenewEvent) {
			if ev.Err != nil {
				h.say("EVENT RENEWED ok=false %v", ev.Err)
				return
			}
			h.say("EVENT RENEWED ok=true token=%d", ev.Grant.Token)
		}))
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
