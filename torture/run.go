package torture

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"
)

// server is the backend under test, started by the parent.
type server interface {
	name() string    // for the output: "pg", "pg (synchronous_commit=off)", "etcd", "etcd cluster of 3 members"
	backend() string // the holders' backend: "pg" or "etcd"
	// targets are the host:port addresses the holders' proxies forward to,
	// one proxy per address and holder: the server's, or every member's.
	targets() []string
	// holderSpec is what a holder needs to reach the server through its
	// proxies, at proxyAddrs (in the order of targets).
	holderSpec(proxyAddrs []string) holderSpec
	// crash crashes the server and restarts it on the same data; it returns
	// when the server serves again. On a cluster it kills the leader, and
	// the other members serve on.
	crash(ctx context.Context) (downtime time.Duration, how string, err error)
	// read reads the scope's floor and both tables at one point.
	read(ctx context.Context, scope string, fl flavor) (Snapshot, error)
	close() error
}

// runConfig is one torture run: one design (flavor) on one server.
type runConfig struct {
	name      string // for the output and the evidence
	slug      string // the evidence's directory names; "" derives one from name
	flavor    flavor
	ttl       time.Duration
	window    time.Duration // each history runs at least this long
	settle    time.Duration // and this long after its last fault ended
	readEvery time.Duration // the parent's reads during a history
	histories int
	only      int // >= 0: run history only (a replay); the others are skipped
	lanes     int // histories run side by side, each lane with its own lease and holders
	holders   int // holder processes per lane
	seed      uint64
	nemesis   nemesisConfig
	quotaMin  int // writes per holding period before the leader resigns
	quotaMax  int
	workMin   time.Duration // the holder's work before each write
	workMax   time.Duration
	txWork    time.Duration // the holder's work inside each write's transaction (runMsg.TxWork)
	noFloor   bool          // the design has no floor (see checkOptions)
	fenceWait time.Duration // checkFenceWaits's bound

	linTimeout  time.Duration
	evidenceDir string // where histories with violations are saved; "" saves none
	keepOne     bool   // save only the first violating history (controls)
	replay      string // the go test flags that replay this run, for the evidence
	logf        func(format string, args ...any)
	holderArgs  []string // arguments that make this binary a holder (TestMain)
}

// runResult is what a run measured and found.
type runResult struct {
	name, server      string
	seed              uint64
	histories         int
	ops               map[Kind]map[Outcome]int
	faults            map[faultKind]int
	kinds             []faultKind // the kinds the nemesis drew from
	downLabel         string      // what downtime is the downtime of
	terms             [2]uint64   // a cluster's raft term at the run's start and end; 0: not a cluster
	checkerTime       time.Duration
	violations        map[string]int
	violating         int // histories with at least one violation
	verdicts          map[porcupine.CheckResult]int
	waits             waitStats
	fenceWait         time.Duration // the bound waits were checked against
	inTx              inTxPauses
	evidence          []string
	examples          []string // the first violations, for the output
	wall              time.Duration
	crashes, downtime time.Duration
	harness           []string // problems of the harness itself (a holder that would not stop)
}

func newRunResult(name, srv string, seed uint64) *runResult {
	return &runResult{name: name, server: srv, seed: seed, ops: map[Kind]map[Outcome]int{},
		faults: map[faultKind]int{}, violations: map[string]int{}, verdicts: map[porcupine.CheckResult]int{}}
}

// runTorture runs cfg's histories against srv and checks each.
func runTorture(ctx context.Context, srv server, cfg runConfig) (*runResult, error) {
	t0 := time.Now()
	r := &runner{cfg: cfg, srv: srv, res: newRunResult(cfg.name, srv.name(), cfg.seed)}
	r.res.fenceWait = cfg.fenceWait
	r.res.kinds, r.res.downLabel = cfg.nemesis.kinds, "server down"
	ms, cluster := srv.(memberServer)
	if cluster {
		r.res.downLabel = "killed leaders down"
		// The raft term rises with every election: the figures say how many
		// leader changes the run's tokens had to survive.
		if t, err := ms.term(ctx); err == nil {
			r.res.terms[0] = t
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer r.closeLanes()
	for i := range cfg.lanes {
		ln := &lane{idx: i, lease: fmt.Sprintf("%s-lane%d", cfg.flavor, i), i2: newI2Run()}
		r.lanes = append(r.lanes, ln)
		for j := range cfg.holders {
			ps, err := startProxies(srv.targets())
			if err != nil {
				return nil, err
			}
			s := &slot{lane: ln, idx: j, proxies: ps}
			ln.slots = append(ln.slots, s)
			if err := r.startHolder(ctx, s); err != nil {
				return nil, err
			}
		}
	}
	queue := make(chan int)
	go func() {
		defer close(queue)
		indices := make([]int, 0, cfg.histories)
		for i := range cfg.histories {
			indices = append(indices, i)
		}
		if cfg.only >= 0 {
			indices = []int{cfg.only}
		}
		for _, i := range indices {
			select {
			case queue <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for _, ln := range r.lanes {
		wg.Go(func() {
			for idx := range queue {
				if err := r.runHistory(ctx, ln, idx); err != nil {
					cancel(fmt.Errorf("%s: history %d: %w", cfg.name, idx, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return r.res, err
	}
	if err := r.closeLanes(); err != nil {
		r.res.harness = append(r.res.harness, err.Error())
	}
	if cluster && r.res.terms[0] > 0 {
		if t, err := ms.term(ctx); err == nil {
			r.res.terms[1] = t
		}
	}
	r.res.wall = time.Since(t0)
	return r.res, nil
}

type runner struct {
	cfg   runConfig
	srv   server
	lanes []*lane
	// crashMu: one server fault (a crash; on a cluster a leader kill or a
	// partition) at a time, whichever lane asks.
	crashMu sync.Mutex
	// serverFaults are every lane's server faults (End 0 while under
	// way): a crash stalls the holders of every lane, and each lane's wait
	// checker must know it.
	serverMu     sync.Mutex
	serverFaults []laneFault

	resMu sync.Mutex
	res   *runResult

	closeOnce sync.Once
	closeErr  error
}

// lane runs histories one after the other with its own holders, on its own
// lease: I2 is checked over all of a lane's histories.
type lane struct {
	idx     int
	lease   string
	slots   []*slot
	i2      *i2Run
	clients atomic.Int64 // porcupine client ids; 0 is the reader

	rec atomic.Pointer[recorder] // the running history, nil between them
	msg atomic.Pointer[runMsg]   // its RUN message (holder and seed set per holder)
}

// slot is one holder position of a lane: its proxies, and the holder
// process currently behind them (a new one after each kill).
type slot struct {
	lane    *lane
	idx     int
	proxies proxySet

	faultMu sync.Mutex // held by the fault acting on this holder

	mu   sync.Mutex
	proc *holderProc
	inc  int // incarnations so far
}

func (s *slot) current() *holderProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// holderProc is one holder process.
type holderProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	name    string
	client  int
	ready   chan struct{}
	stopped chan int // histories of its STOPPED lines
	exited  chan struct{}
	waitErr error
	stderr  tailBuffer
	inc     int         // the slot's incarnation it is
	killed  atomic.Bool // by the nemesis (or the harness): its exit is expected
	writeMu sync.Mutex
}

func (p *holderProc) send(line string) error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	_, err := io.WriteString(p.stdin, line+"\n")
	return err
}

func (p *holderProc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// startHolder starts a new holder process in slot s and waits for READY;
// if a history runs, it is sent the history's RUN.
func (r *runner) startHolder(ctx context.Context, s *slot) error {
	spec := r.srv.holderSpec(s.proxies.addrs())
	spec.Flavor, spec.TTL, spec.Lease = r.cfg.flavor, r.cfg.ttl, s.lane.lease
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, r.cfg.holderArgs...)
	cmd.Env = append(os.Environ(), holderEnv+"="+string(b))
	if os.Getenv("GORACE") == "" {
		// A race-enabled holder would sleep a second at exit.
		cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0")
	}
	// A holder dies with the test binary, even a frozen one: no holder
	// outlives a killed run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s.mu.Lock()
	s.inc++
	p := &holderProc{cmd: cmd, name: fmt.Sprintf("l%ds%di%d", s.lane.idx, s.idx, s.inc), inc: s.inc,
		client: int(s.lane.clients.Add(1)), ready: make(chan struct{}), stopped: make(chan int, 8), exited: make(chan struct{})}
	s.mu.Unlock()
	cmd.Stderr = &p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go p.readLoop(stdout, s.lane)
	started := time.Now()
	defer func() {
		if d := time.Since(started); d > 5*time.Second && r.cfg.logf != nil {
			r.cfg.logf("%s: holder %s took %v to start", r.cfg.name, p.name, d.Round(time.Millisecond))
		}
	}()
	select {
	case <-p.ready:
	case <-p.exited:
		return fmt.Errorf("holder %s exited before READY (%v): %s", p.name, p.waitErr, p.stderr.String())
	case <-time.After(60 * time.Second):
		p.killed.Store(true)
		p.signal(syscall.SIGKILL)
		return fmt.Errorf("holder %s not ready within a minute: %s", p.name, p.stderr.String())
	case <-ctx.Done():
		p.killed.Store(true)
		p.signal(syscall.SIGKILL)
		return context.Cause(ctx)
	}
	s.mu.Lock()
	old := s.proc
	s.proc = p
	s.mu.Unlock()
	if old != nil {
		select {
		case <-old.exited:
		default: // never left running untracked
			old.killed.Store(true)
			old.signal(syscall.SIGKILL)
			r.harnessProblem(fmt.Sprintf("holder %s was replaced while it still ran; killed", old.name))
		}
	}
	if m := s.lane.msg.Load(); m != nil {
		return p.send("RUN " + r.runLine(*m, s, p))
	}
	return nil
}

// runLine is the RUN message of history m for holder p of slot s.
func (r *runner) runLine(m runMsg, s *slot, p *holderProc) string {
	m.Holder = p.name
	m.Seed = r.cfg.seed ^ uint64(m.History)<<20 ^ uint64(s.idx)<<8 ^ uint64(p.inc)
	b, _ := json.Marshal(m)
	return string(b)
}

func (p *holderProc) readLoop(stdout io.Reader, ln *lane) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	readyOnce := sync.Once{}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "READY":
			readyOnce.Do(func() { close(p.ready) })
		case strings.HasPrefix(line, "STOPPED "):
			n, _ := strconv.Atoi(strings.TrimPrefix(line, "STOPPED "))
			select {
			case p.stopped <- n:
			default:
			}
		case strings.HasPrefix(line, "E "):
			var ev event
			if err := json.Unmarshal([]byte(line[2:]), &ev); err != nil {
				_, _ = p.stderr.Write([]byte("bad event line: " + line + "\n"))
				continue
			}
			if rec := ln.rec.Load(); rec != nil {
				rec.add(p.client, p.name, ev)
			}
		default:
			_, _ = p.stderr.Write([]byte(line + "\n"))
		}
	}
	p.waitErr = p.cmd.Wait()
	close(p.exited)
}

// runHistory runs history idx on lane ln: RUN to every holder, the
// parent's reads, the faults of its schedule, STOP, the final read, and
// the checkers.
func (r *runner) runHistory(ctx context.Context, ln *lane, idx int) error {
	cfg := r.cfg
	plan := planHistory(cfg.seed, idx, cfg.nemesis, cfg.ttl, cfg.window, cfg.holders)
	scope := fmt.Sprintf("%s-h%d", cfg.flavor, idx)
	rec := newRecorder(idx)
	ln.rec.Store(rec)
	defer ln.rec.Store(nil)
	msg := runMsg{History: idx, Scope: scope, QuotaMin: cfg.quotaMin, QuotaMax: cfg.quotaMax,
		WorkMin: cfg.workMin, WorkMax: cfg.workMax, TxWork: cfg.txWork}
	ln.msg.Store(&msg)
	start, histStart := time.Now(), monoNow()
	for _, s := range ln.slots {
		p := s.current()
		if err := p.send("RUN " + r.runLine(msg, s, p)); err != nil {
			return fmt.Errorf("RUN to %s: %w", p.name, err)
		}
	}

	rctx, stopReads := context.WithCancel(ctx)
	var reads sync.WaitGroup
	reads.Go(func() { r.readLoop(rctx, rec, scope) })

	var faults sync.WaitGroup
	var lastEnd atomic.Int64 // unix nanoseconds of the last fault's end
	var faultErr error
	var faultErrMu sync.Mutex
	for _, f := range plan {
		faults.Go(func() {
			if !sleepCtx(ctx, time.Until(start.Add(f.At))) {
				return
			}
			fr, err := r.inject(ctx, ln, rec, f)
			if err != nil {
				faultErrMu.Lock()
				faultErr = errors.Join(faultErr, err)
				faultErrMu.Unlock()
				return
			}
			rec.addFault(fr)
			for {
				old := lastEnd.Load()
				if now := time.Now().UnixNano(); now <= old || lastEnd.CompareAndSwap(old, now) {
					break
				}
			}
		})
	}
	faults.Wait()
	if faultErr != nil {
		stopReads()
		return faultErr
	}
	end := start.Add(cfg.window)
	if last := time.Unix(0, lastEnd.Load()).Add(cfg.settle); last.After(end) {
		end = last
	}
	if !sleepCtx(ctx, time.Until(end)) {
		stopReads()
		return context.Cause(ctx)
	}

	// Stop: nothing frozen or held may keep a holder from answering.
	stopAt := time.Now()
	defer func() {
		// A slow stop is the first thing to look at when a run takes longer
		// than its windows add up to.
		if d := time.Since(stopAt); d > 5*time.Second && cfg.logf != nil {
			cfg.logf("%s: history %d: stopping the holders and the final read took %v", cfg.name, idx, d.Round(time.Millisecond))
		}
	}()
	for _, s := range ln.slots {
		s.current().signal(syscall.SIGCONT)
		s.proxies.release()
	}
	ln.msg.Store(nil)
	for _, s := range ln.slots {
		_ = s.current().send("STOP")
	}
	for _, s := range ln.slots {
		if err := r.awaitStopped(ctx, s, idx); err != nil {
			stopReads()
			return err
		}
	}
	stopReads()
	reads.Wait()
	final, err := r.finalRead(ctx, rec, scope)
	if err != nil {
		return err
	}
	ops, frs, stray := rec.finish()
	if stray > 0 {
		r.harnessProblem(fmt.Sprintf("history %d: %d events of holders matched no operation of the history", idx, stray))
	}
	// The wait checker also sees the other lanes' server faults: they
	// stall this lane's holders too.
	others := r.otherLanesServerFaults(ln, histStart)
	res := checkHistory(ops, append(slices.Clone(frs), others...), final, ln.i2, idx,
		checkOptions{noFloor: cfg.noFloor, linTimeout: cfg.linTimeout, fenceWait: cfg.fenceWait, rowLocks: r.srv.backend() == "pg"})
	return r.record(idx, plan, ops, frs, res)
}

// awaitStopped waits for slot s's holder to answer STOP for history idx.
// A holder that does not answer within a minute is killed and replaced:
// a harness problem, reported, not a violation (its operations in flight
// stay unknown).
func (r *runner) awaitStopped(ctx context.Context, s *slot, idx int) error {
	p := s.current()
	timeout := time.After(time.Minute)
	for {
		select {
		case n := <-p.stopped:
			if n == idx || n == -1 {
				return nil
			}
		case <-p.exited:
			return fmt.Errorf("holder %s exited during STOP (%v): %s", p.name, p.waitErr, p.stderr.String())
		case <-timeout:
			r.harnessProblem(fmt.Sprintf("history %d: holder %s did not stop within a minute; replaced. stderr: %s", idx, p.name, p.stderr.String()))
			p.killed.Store(true)
			p.signal(syscall.SIGKILL)
			<-p.exited
			return r.startHolder(ctx, s)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// readLoop reads the scope every readEvery (with jitter) until ctx ends. A
// read that fails says nothing and is dropped.
func (r *runner) readLoop(ctx context.Context, rec *recorder, scope string) {
	for sleepCtx(ctx, r.cfg.readEvery/2+rand.N(r.cfg.readEvery)) {
		op, ok := r.readOnce(ctx, scope, r.cfg.readEvery*5)
		if ok {
			rec.addRead(op)
		}
	}
}

func (r *runner) readOnce(ctx context.Context, scope string, timeout time.Duration) (Op, bool) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	op := Op{Client: 0, Holder: "reader", Kind: KindRead, Invoke: monoNow()}
	snap, err := r.srv.read(rctx, scope, r.cfg.flavor)
	op.Return = monoNow()
	if err != nil {
		return op, false
	}
	op.Outcome, op.Read = OutOK, &snap
	return op, true
}

// finalRead reads the scope once every holder stopped, retrying while the
// server recovers from a crash another lane caused.
func (r *runner) finalRead(ctx context.Context, rec *recorder, scope string) (Snapshot, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		op, ok := r.readOnce(ctx, scope, 5*time.Second)
		if ok {
			op.Holder = "final read"
			rec.addRead(op)
			return *op.Read, nil
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 100*time.Millisecond) {
			return Snapshot{}, fmt.Errorf("final read of scope %q failed for a minute", scope)
		}
	}
}

// inject carries out one fault and returns its record.
func (r *runner) inject(ctx context.Context, ln *lane, rec *recorder, f plannedFault) (faultRecord, error) {
	s := ln.slots[f.Slot]
	target := -1
	if f.Leader {
		target = rec.leader()
	}
	aimedInTx := f.InTx && f.Kind == faultPause
	afterAck := f.AfterAck && !aimedInTx
	slotOf := func(client int) *slot {
		for _, c := range ln.slots {
			if c.current().client == client {
				return c
			}
		}
		return nil
	}
	inTx, locked := false, false // struck on a holder's report of being inside; s.faultMu held
	if aimedInTx {
		// Strike at once: the holder is inside its transaction for the
		// in-transaction work only (runMsg.TxWork). A holder another fault
		// is acting on (another in-transaction pause woken by the same
		// report) is left to it: the next report is waited for.
		for limit := time.Now().Add(2 * r.cfg.ttl); !inTx; {
			c, ok := rec.nextInTx(ctx, time.Until(limit))
			if !ok {
				break
			}
			if cs := slotOf(c); cs != nil && cs.faultMu.TryLock() {
				s, target, inTx, locked = cs, c, true, true
			}
		}
	} else if afterAck {
		if c, ok := rec.nextAck(ctx, 2*r.cfg.ttl); ok {
			target = c
			// Strike a little later, inside the writer's work before its
			// next write (at least workMin): right after the answer it may
			// not have reached its lease check yet, and a holder frozen
			// before that check finds its lease gone when thawed and sends
			// nothing.
			sleepCtx(ctx, r.cfg.workMin/4)
		}
	}
	if cs := slotOf(target); cs != nil && !locked {
		s = cs
	}
	if f.Kind != faultCrash && f.Kind != faultPartition {
		// One fault at a time per holder: two kills of one leader would
		// otherwise both start a replacement, and one of them would run on,
		// untracked, campaigning for an old history.
		if !locked {
			s.faultMu.Lock()
		}
		defer s.faultMu.Unlock()
	}
	p := s.current()
	fr := faultRecord{Kind: f.Kind, Target: p.name, Start: monoNow(), InTx: aimedInTx, OnReport: inTx}
	switch f.Kind {
	case faultPause:
		p.signal(syscall.SIGSTOP)
		t0 := time.Now()
		sleepCtx(ctx, f.Dur) // thawed whatever happens: a frozen holder never stays behind
		if r.cfg.nemesis.pauseUntilTakeover || (r.cfg.nemesis.ackedPauseUntilTakeover && afterAck) {
			// Frozen on until another holder's write was acknowledged (at
			// most 6 TTL in all): the write it sends after the thaw is then
			// certainly stale.
			for limit := t0.Add(6 * r.cfg.ttl); ; {
				c, ok := rec.nextAck(ctx, time.Until(limit))
				if !ok || c != p.client {
					break
				}
			}
		}
		p.signal(syscall.SIGCONT)
		fr.Note = fmt.Sprintf("SIGSTOP, SIGCONT after %v", time.Since(t0).Round(time.Millisecond))
		switch {
		case inTx:
			fr.Note = "aimed inside a fenced transaction: " + fr.Note
		case fr.InTx:
			fr.Note = fmt.Sprintf("aimed inside a fenced transaction, but no holder reported being inside one within %v: %s", 2*r.cfg.ttl, fr.Note)
		}
	case faultKill:
		p.killed.Store(true)
		p.signal(syscall.SIGKILL)
		<-p.exited
		fr.End = monoNow()
		r.checkRaces(p)
		if err := r.startHolder(ctx, s); err != nil {
			return fr, fmt.Errorf("restart after kill: %w", err)
		}
		fr.Note = "SIGKILL; replaced by " + s.current().name
		return fr, nil
	case faultCrash:
		fr.Target = ""
		r.crashMu.Lock()
		fr.Start = monoNow()
		ended := r.serverFaultBegins(ln, f.Kind, fr.Start)
		down, how, err := r.srv.crash(ctx)
		ended()
		r.crashMu.Unlock()
		if err != nil {
			return fr, fmt.Errorf("server crash: %w", err)
		}
		fr.Note = fmt.Sprintf("%s; down %v", how, down.Round(time.Millisecond))
		r.resMu.Lock()
		r.res.downtime += down
		r.resMu.Unlock()
	case faultPartition:
		ms, ok := r.srv.(memberServer)
		if !ok {
			return fr, fmt.Errorf("partition: %s has no members to partition", r.srv.name())
		}
		// A server fault like a crash, and one at a time with them: the
		// member partitioned is never the one killed, and a majority of the
		// members stays up and connected.
		r.crashMu.Lock()
		fr.Start = monoNow()
		ended := r.serverFaultBegins(ln, f.Kind, fr.Start)
		target, how, err := ms.partition(ctx, f)
		ended()
		r.crashMu.Unlock()
		if err != nil {
			return fr, fmt.Errorf("partition: %w", err)
		}
		fr.Target, fr.Note = target, how
	case faultDelay:
		s.proxies.hold()
		sleepCtx(ctx, f.Dur)
		s.proxies.release()
		where := "the proxy"
		if len(s.proxies) > 1 {
			where = fmt.Sprintf("its %d proxies (one per member)", len(s.proxies))
		}
		fr.Note = fmt.Sprintf("traffic held in %s for %v, then delivered", where, f.Dur.Round(time.Millisecond))
	}
	fr.End = monoNow()
	return fr, nil
}

// laneFault is a server fault and the lane that drew it.
type laneFault struct {
	lane int
	f    faultRecord
}

// serverFaultBegins logs a server fault of lane ln that began at start
// for every lane's wait checker; ended logs its end.
func (r *runner) serverFaultBegins(ln *lane, kind faultKind, start int64) (ended func()) {
	r.serverMu.Lock()
	defer r.serverMu.Unlock()
	i := len(r.serverFaults)
	r.serverFaults = append(r.serverFaults, laneFault{lane: ln.idx, f: faultRecord{Kind: kind, Start: start}})
	return func() {
		r.serverMu.Lock()
		defer r.serverMu.Unlock()
		r.serverFaults[i].f.End = monoNow()
	}
}

// otherLanesServerFaults are the server faults other lanes than ln drew
// that may have touched a history begun at since (one still under way
// ends never).
func (r *runner) otherLanesServerFaults(ln *lane, since int64) []faultRecord {
	r.serverMu.Lock()
	defer r.serverMu.Unlock()
	var fs []faultRecord
	for _, lf := range r.serverFaults {
		f := lf.f
		if lf.lane == ln.idx {
			continue
		}
		if f.End == 0 {
			f.End = math.MaxInt64 - int64(serverGrace)
		}
		if f.End+int64(serverGrace) >= since {
			f.Note = fmt.Sprintf("drawn by lane %d", lf.lane)
			fs = append(fs, f)
		}
	}
	return fs
}

// record adds one checked history to the run's figures and saves the
// evidence of a violation.
func (r *runner) record(idx int, plan []plannedFault, ops []*Op, frs []faultRecord, res checkResult) error {
	r.resMu.Lock()
	defer r.resMu.Unlock()
	out := r.res
	out.histories++
	for _, op := range ops {
		if out.ops[op.Kind] == nil {
			out.ops[op.Kind] = map[Outcome]int{}
		}
		out.ops[op.Kind][op.Outcome]++
	}
	for _, f := range frs {
		out.faults[f.Kind]++
	}
	out.checkerTime += res.took
	out.verdicts[res.lin]++
	out.waits.add(res.waits)
	out.inTx.add(ops, frs)
	if len(res.violations) == 0 {
		return nil
	}
	out.violating++
	for c, n := range countByChecker(res.violations) {
		out.violations[c] += n
	}
	for _, v := range res.violations {
		if len(out.examples) < 5 {
			out.examples = append(out.examples, fmt.Sprintf("history %d: %s", idx, v))
		}
	}
	if r.cfg.evidenceDir == "" || (r.cfg.keepOne && len(out.evidence) > 0) {
		return nil
	}
	dir, err := saveEvidence(r.cfg, idx, plan, ops, frs, res)
	if err != nil {
		return fmt.Errorf("saving the evidence: %w", err)
	}
	out.evidence = append(out.evidence, dir)
	if r.cfg.logf != nil {
		r.cfg.logf("%s: history %d: %d violations; evidence in %s", r.cfg.name, idx, len(res.violations), dir)
	}
	return nil
}

// checkRaces reports a data race the race detector found in a holder that
// did not exit on its own (a killed holder's exit code says nothing).
func (r *runner) checkRaces(p *holderProc) {
	if out := p.stderr.String(); strings.Contains(out, "WARNING: DATA RACE") {
		r.harnessProblem(fmt.Sprintf("holder %s: the race detector found a data race: %s", p.name, out))
	}
}

func (r *runner) harnessProblem(s string) {
	r.resMu.Lock()
	defer r.resMu.Unlock()
	r.res.harness = append(r.res.harness, s)
}

// closeLanes ends every holder (its standard input closed: it stops and
// exits; killed if it does not) and every proxy. A holder that exits with
// an error (a data race found by -race, a panic) is reported.
func (r *runner) closeLanes() error {
	r.closeOnce.Do(func() {
		var errs []error
		for _, ln := range r.lanes {
			for _, s := range ln.slots {
				if p := s.current(); p != nil {
					p.signal(syscall.SIGCONT)
					s.proxies.release()
					_ = p.stdin.Close()
					select {
					case <-p.exited:
					case <-time.After(30 * time.Second):
						p.killed.Store(true)
						p.signal(syscall.SIGKILL)
						<-p.exited
					}
					if p.waitErr != nil && !p.killed.Load() {
						errs = append(errs, fmt.Errorf("holder %s: %v: %s", p.name, p.waitErr, p.stderr.String()))
					} else if p.killed.Load() {
						r.checkRaces(p)
					}
				}
				_ = s.proxies.close()
			}
		}
		r.closeErr = errors.Join(errs...)
	})
	return r.closeErr
}

// sleepCtx sleeps d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// tailBuffer keeps the last 64 KiB written to it: a holder's standard
// error, for the report when something goes wrong.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - 64<<10; over > 0 {
		t.b = slices.Clone(t.b[over:])
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
