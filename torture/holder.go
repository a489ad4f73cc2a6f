package torture

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// holderEnv makes a process a holder: it carries the holderSpec as JSON.
const holderEnv = "LEASEFENCE_TORTURE_HOLDER"

// flavor is the design a run checks: the fence, or one of the negative
// controls that must fail.
type flavor string

const (
	// flavorFenced: the library — leasecore.Campaign on its lease store,
	// user data written through fencepg.Fence.RunTx or fenceetcd.Fence.Commit
	// after Fence.Advance.
	flavorFenced flavor = "fenced"
	// flavorUnfenced: the same lease, the same user data in one
	// transaction, and no fence at all (negative control: I3).
	flavorUnfenced flavor = "unfenced"
	// flavorStrict: a fence of this package's own SQL that compares with <
	// instead of <=, so a holder's second write under its token is refused
	// (negative control: linearizability).
	flavorStrict flavor = "strict"
	// flavorNaive: the lease statements of the lease-fencing article
	// (SOURCES.md) and a correct check of this package's own SQL, neither
	// forcing durable commits, on a cluster with synchronous_commit=off
	// (negative control: token reuse and lost acknowledged writes after
	// immediate stops).
	flavorNaive flavor = "naive"
	// flavorCheckFirst: fencepg's fenced transaction as it was before it
	// decided at commit, in this package's own SQL — the check first, its
	// lock on the floor row held until COMMIT (negative control: a holder
	// frozen inside it makes a newer holder's Advance wait, "waited on the
	// fence").
	flavorCheckFirst flavor = "check-first"
)

// ownFence reports whether the flavor's floor is this package's own
// (torture.fence_floor) rather than the library's.
func (fl flavor) ownFence() bool {
	return fl == flavorStrict || fl == flavorNaive || fl == flavorCheckFirst
}

// holderSpec is what a holder process needs; the parent passes it in
// holderEnv.
type holderSpec struct {
	Backend     string        `json:"backend"` // "pg" or "etcd"
	Flavor      flavor        `json:"flavor"`
	LeaseDSN    string        `json:"lease_dsn,omitempty"`
	ResourceDSN string        `json:"resource_dsn,omitempty"`
	Endpoints   []string      `json:"endpoints,omitempty"`
	Prefix      string        `json:"prefix,omitempty"`
	TTL         time.Duration `json:"ttl"`
	Lease       string        `json:"lease"` // the lane's lease, the same over all its histories
}

// runMsg starts one history in a holder: "RUN <json>".
type runMsg struct {
	History  int           `json:"history"`
	Scope    string        `json:"scope"`
	Holder   string        `json:"holder"`
	Seed     uint64        `json:"seed"`
	QuotaMin int           `json:"quota_min"` // writes per holding period before the leader resigns
	QuotaMax int           `json:"quota_max"`
	WorkMin  time.Duration `json:"work_min"` // the "work" before each write, where a pause usually lands
	WorkMax  time.Duration `json:"work_max"`
	// TxWork is the "work" inside a write's transaction, between its two
	// tables' statements (PostgreSQL), where the in-transaction pauses
	// strike: it must outlast the nemesis's reaction to the holder's "t"
	// event.
	TxWork time.Duration `json:"tx_work"`
}

// dataWriter writes the user data of one scope under a claim: every part
// of the write in both tables, in one transaction.
type dataWriter interface {
	// Fenced reports whether the design has a floor to Advance.
	Fenced() bool
	Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error)
	// Write reports through tx when it is inside its transaction (and
	// does the in-transaction work there, if it has statements to put it
	// between) and when its own statements are done.
	Write(ctx context.Context, c leasecore.Claim, parts []int, content string, tx *txProbe) (leasecore.Result, error)
}

// holderBackend is what a holder opened.
type holderBackend struct {
	lease leasecore.Lease
	data  dataWriter
	close func()
}

// IsHolderProcess reports whether this process was started as a torture
// holder; TestMain then calls HolderMain.
func IsHolderProcess() bool { return os.Getenv(holderEnv) != "" }

// HolderMain runs this process as a holder until its standard input ends
// and returns the exit code. Protocol: it prints READY once it opened its
// stores; "RUN <runMsg>" starts campaigning for a history, "STOP" ends it
// (the campaign returns after its lead function and the release) and is
// answered "STOPPED <history>". Every operation is printed as it is
// invoked and as it completes ("E <event>").
func HolderMain() int {
	var spec holderSpec
	if err := json.Unmarshal([]byte(os.Getenv(holderEnv)), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "torture holder: %s: %v\n", holderEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	be, err := openHolder(ctx, spec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "torture holder: open: %v\n", err)
		return 1
	}
	defer be.close()
	out := &emitter{w: os.Stdout}
	out.line("READY")

	var cur *holderRun
	stopCur := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			out.line("STOPPED " + strconv.Itoa(cur.msg.History))
			cur = nil
		}
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "RUN":
			stopCur()
			var msg runMsg
			if err := json.Unmarshal([]byte(arg), &msg); err != nil {
				fmt.Fprintf(os.Stderr, "torture holder: RUN: %v\n", err)
				return 2
			}
			cur = startRun(ctx, spec, be, out, msg)
		case "STOP":
			if cur == nil {
				out.line("STOPPED -1")
			}
			stopCur()
		default:
			fmt.Fprintf(os.Stderr, "torture holder: unknown command %q\n", cmd)
			return 2
		}
	}
	stopCur()
	return 0
}

// holderRun is one history's campaign in a holder.
type holderRun struct {
	msg    runMsg
	cancel context.CancelFunc
	done   chan struct{}
}

// startRun campaigns for the lane's lease until cancelled. While leading,
// the holder advances the floor once and then writes: a short piece of
// "work" (a sleep that does not look at the lease), then one write of a
// random set of parts. After a few writes it resigns, so the lease changes
// hands even without faults.
func startRun(parent context.Context, spec holderSpec, be *holderBackend, out *emitter, msg runMsg) *holderRun {
	ctx, cancel := context.WithCancel(parent)
	r := &holderRun{msg: msg, cancel: cancel, done: make(chan struct{})}
	rng := rand.New(rand.NewPCG(msg.Seed, 0x746f7274757265))
	log := &opLog{out: out, history: msg.History}
	lease := &loggedLease{inner: be.lease, log: log}
	// A request in flight when its holder freezes must still be answered
	// after the thaw rather than time out at once: well above the longest
	// pause (3 TTL).
	opTimeout := 5*spec.TTL + 2*time.Second
	writes := 0
	lead := func(lctx context.Context, g leasecore.Grant) error {
		claim := leasecore.Claim{Scope: msg.Scope, Writer: msg.Holder, Token: g.Token}
		if be.data.Fenced() {
			res, err := log.fence(KindAdvance, claim, 0, "", func(*txProbe) (leasecore.Result, error) {
				return be.data.Advance(lctx, claim)
			})
			if err != nil {
				return err
			}
			if !res.Accepted {
				return fmt.Errorf("advance: superseded by token %d: %w", res.Floor, leasecore.ErrLost)
			}
		}
		quota := msg.QuotaMin + rng.IntN(msg.QuotaMax-msg.QuotaMin+1)
		failures := 0
		for range quota {
			if lctx.Err() != nil {
				return context.Cause(lctx)
			}
			// The work between the check above and the write below: a pause
			// (SIGSTOP) mostly lands here, and the write then follows
			// without another look at the lease, as the stale holder of the
			// lease-fencing article (SOURCES.md) does.
			time.Sleep(msg.WorkMin + time.Duration(rng.Int64N(int64(msg.WorkMax-msg.WorkMin)+1)))
			mask := uint8(1 + rng.IntN(1<<NumParts-1))
			writes++
			content := fmt.Sprintf("%s/%d", msg.Holder, writes)
			// Not the lead context: it ends at the local deadline, which a
			// frozen holder passes while frozen, and the write would then
			// never reach the server. A holder cannot know it was frozen;
			// the write it already decided on goes out, and only the fence
			// may stop it.
			wctx, wcancel := context.WithTimeout(context.WithoutCancel(lctx), opTimeout)
			res, err := log.fence(KindWrite, claim, mask, content, func(tx *txProbe) (leasecore.Result, error) {
				tx.workTime = msg.TxWork
				return be.data.Write(wctx, claim, maskParts(mask), content, tx)
			})
			wcancel()
			switch {
			case err != nil && !(res.Floor > 0 && !res.Accepted):
				if failures++; failures >= 3 {
					return err
				}
			case !res.Accepted:
				return fmt.Errorf("write: superseded by token %d: %w", res.Floor, leasecore.ErrLost)
			}
		}
		return nil // resign: the lease goes to whoever campaigns next
	}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			err := leasecore.Campaign(ctx, lease, spec.Lease, msg.Holder, lead,
				leasecore.WithSessionOptions(leasecore.WithTTL(spec.TTL)))
			if ctx.Err() != nil {
				return
			}
			if err != nil && !errors.Is(err, leasecore.ErrLost) && !errors.Is(err, leasecore.ErrUnavailable) {
				fmt.Fprintf(os.Stderr, "torture holder %s: campaign: %v\n", msg.Holder, err)
			}
			// Campaign returns when lead returned while the session still ran
			// (resigned, superseded, or an error): campaign again after a
			// pause that lets another holder take the lease.
			t := time.NewTimer(rand.N(spec.TTL / 2))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}()
	return r
}

// emitter writes the holder's lines to its standard output, one at a time.
type emitter struct {
	mu  sync.Mutex
	w   io.Writer
	seq int
}

func (e *emitter) line(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = io.WriteString(e.w, s+"\n")
}

// opLog logs one history's operations through the emitter.
type opLog struct {
	out     *emitter
	history int
}

// invoke reads the clock, then prints the invocation: the time is taken
// before the request is sent (and before any wait for the output lock).
func (l *opLog) invoke(ev event) int {
	ev.T = monoNow()
	ev.Phase, ev.History = "i", l.history
	l.out.mu.Lock()
	defer l.out.mu.Unlock()
	l.out.seq++
	ev.Seq = l.out.seq
	b, _ := json.Marshal(ev)
	_, _ = l.out.w.Write(append(append([]byte("E "), b...), '\n'))
	return ev.Seq
}

// complete prints the completion of invocation seq; the time is taken
// before anything else.
func (l *opLog) complete(seq int, ev event) {
	ev.T = monoNow()
	ev.Phase, ev.History, ev.Seq = "c", l.history, seq
	b, _ := json.Marshal(ev)
	l.out.line("E " + string(b))
}

// fence runs one fence operation (advance or write) and logs it. A
// rejection is definite even when the backend also returned an error (the
// rejection's own log entry failed); any other error leaves the outcome
// unknown: the request may have been applied.
func (l *opLog) fence(kind Kind, c leasecore.Claim, mask uint8, content string, do func(*txProbe) (leasecore.Result, error)) (leasecore.Result, error) {
	seq := l.invoke(event{Kind: kind, Token: uint64(c.Token), Mask: mask, Content: content})
	res, err := do(&txProbe{log: l, seq: seq})
	ev := event{}
	switch {
	case !res.Accepted && res.Floor > 0:
		ev.Outcome, ev.Floor = OutRejected, uint64(res.Floor)
	case err != nil:
		ev.Outcome = OutUnknown
	case res.Accepted:
		ev.Outcome, ev.Floor = OutAccepted, uint64(res.Floor)
	default:
		ev.Outcome, ev.Floor = OutRejected, uint64(res.Floor)
	}
	if err != nil {
		ev.Err = err.Error()
	}
	l.complete(seq, ev)
	return res, err
}

// txProbe is how a write tells the parent where it is in its
// transaction: the nemesis strikes the in-transaction pauses on inside's
// event, and the figures tell from both events where each pause struck.
type txProbe struct {
	log      *opLog
	seq      int
	workTime time.Duration // runMsg.TxWork
}

// inside reports that the write is inside its transaction; then, when the
// design has statements to put it between, the caller does work().
func (p *txProbe) inside() { p.log.mark(p.seq, "t") }

// work is the in-transaction work: a sleep that holds the transaction
// open, long enough for the nemesis to strike in it.
func (p *txProbe) work() { time.Sleep(p.workTime) }

// done reports that the write's own statements are done: the commit
// follows.
func (p *txProbe) done() { p.log.mark(p.seq, "d") }

// mark prints a moment of invocation seq; the time is taken first.
func (l *opLog) mark(seq int, phase string) {
	b, _ := json.Marshal(event{Phase: phase, History: l.history, Seq: seq, T: monoNow()})
	l.out.line("E " + string(b))
}

// loggedLease logs every Acquire, Renew and Release of a lease; Campaign
// and its sessions use it as their lease. It is a Waiter when the lease
// is.
type loggedLease struct {
	inner leasecore.Lease
	log   *opLog
}

var _ backendkit.Waiter = (*loggedLease)(nil)

func (l *loggedLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	seq := l.log.invoke(event{Kind: KindAcquire})
	g, err := l.inner.Acquire(ctx, name, holder, ttl)
	ev := event{Outcome: OutOK, Token: uint64(g.Token)}
	switch {
	case errors.Is(err, leasecore.ErrHeld):
		ev.Outcome = OutHeld
	case err != nil:
		ev.Outcome = OutUnknown
	}
	if err != nil {
		ev.Token, ev.Err = 0, err.Error()
	}
	l.log.complete(seq, ev)
	return g, err
}

func (l *loggedLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	seq := l.log.invoke(event{Kind: KindRenew, Token: uint64(g.Token)})
	ng, err := l.inner.Renew(ctx, g)
	l.log.complete(seq, leaseEvent(err))
	return ng, err
}

func (l *loggedLease) Release(ctx context.Context, g leasecore.Grant) error {
	seq := l.log.invoke(event{Kind: KindRelease, Token: uint64(g.Token)})
	err := l.inner.Release(ctx, g)
	l.log.complete(seq, leaseEvent(err))
	return err
}

// WaitFree waits with the lease's own Waiter, or tells Campaign to poll.
func (l *loggedLease) WaitFree(ctx context.Context, name string) error {
	if w, ok := l.inner.(backendkit.Waiter); ok {
		return w.WaitFree(ctx, name)
	}
	return errors.ErrUnsupported
}

func leaseEvent(err error) event {
	switch {
	case err == nil:
		return event{Outcome: OutOK}
	case errors.Is(err, leasecore.ErrLost):
		return event{Outcome: OutLost, Err: err.Error()}
	}
	return event{Outcome: OutUnknown, Err: err.Error()}
}

// openHolder opens the lease and the data writer of spec.
func openHolder(ctx context.Context, spec holderSpec) (*holderBackend, error) {
	switch spec.Backend {
	case "pg":
		return openPGHolder(ctx, spec)
	case "etcd":
		return openEtcdHolder(ctx, spec)
	}
	return nil, fmt.Errorf("unknown backend %q", spec.Backend)
}
