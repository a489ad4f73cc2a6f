package fenceetcd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// The deadline promise (package doc): every call that takes a context
// returns within deadlineSlack of its context's deadline or cancellation,
// also when the server stops answering, clean-up included.
const (
	callDeadline  = 300 * time.Millisecond
	deadlineSlack = 50 * time.Millisecond
)

// freezer is an etcd server of a test's own (freezing the shared one would
// stall every other test) and a client of it that can stop the server with
// SIGSTOP right before a given request goes out, so a call is caught at
// any step: before its first request, or between two of them (the
// clean-up after a transaction whose answer never came, say).
type freezer struct {
	t   *testing.T
	srv *etcdtemp.Server
	cli *clientv3.Client

	mu     sync.Mutex
	frozen bool
	// at, when set, freezes the server right before the (skip+1)-th
	// request of a method whose name ends with it ("/Txn",
	// "/LeaseRevoke"; "/LeaseKeepAlive" and "/Watch" at a stream's send).
	at      string
	skip    int
	freezes atomic.Int32 // how often the server was stopped
}

func newFreezer(t *testing.T) *freezer {
	t.Helper()
	fz := &freezer{t: t, srv: etcdtemp.StartTB(t)}
	fz.cli = dialWith(t, fz.srv.Endpoints(),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			fz.before(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
			method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			st, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return freezingStream{st, fz, method}, nil
		}),
	)
	t.Cleanup(fz.thaw) // never leave a stopped process behind
	fz.waitServing()
	return fz
}

type freezingStream struct {
	grpc.ClientStream
	fz     *freezer
	method string
}

func (s freezingStream) SendMsg(m any) error {
	s.fz.before(s.method)
	return s.ClientStream.SendMsg(m)
}

// freezeAt arms the freeze before the (skip+1)-th request of method.
func (fz *freezer) freezeAt(method string, skip int) {
	fz.mu.Lock()
	defer fz.mu.Unlock()
	fz.at, fz.skip = method, skip
}

func (fz *freezer) before(method string) {
	fz.mu.Lock()
	defer fz.mu.Unlock()
	if fz.at == "" || !strings.HasSuffix(method, fz.at) {
		return
	}
	if fz.skip > 0 {
		fz.skip--
		return
	}
	fz.at = ""
	fz.stopLocked()
}

func (fz *freezer) freeze() {
	fz.mu.Lock()
	defer fz.mu.Unlock()
	fz.stopLocked()
}

func (fz *freezer) stopLocked() {
	if fz.frozen {
		return
	}
	pid := fz.srv.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		fz.t.Errorf("SIGSTOP etcd pid %d: %v", pid, err)
		return
	}
	fz.frozen = true
	fz.freezes.Add(1)
	// kill returns once the signal is queued; a thread of the server
	// running on another CPU can still answer a request until it stops.
	if err := waitStopped(pid, time.Second); err != nil {
		fz.t.Error(err)
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc/<pid>/task/*/stat).
func waitStopped(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		running, err := runningThreads(pid)
		if err == nil && running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: %d threads still running %v after SIGSTOP (%v)", pid, running, limit, err)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func runningThreads(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	running := 0
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state ...: comm may contain spaces, the state follows the last ')'.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		if f := bytes.Fields(rest); len(f) == 0 || (f[0][0] != 'T' && f[0][0] != 't') {
			running++
		}
	}
	return running, nil
}

// thaw resumes the server and disarms any freeze not yet triggered.
func (fz *freezer) thaw() {
	fz.mu.Lock()
	defer fz.mu.Unlock()
	fz.at = ""
	if !fz.frozen {
		return
	}
	if err := syscall.Kill(fz.srv.PID(), syscall.SIGCONT); err != nil {
		fz.t.Errorf("SIGCONT etcd pid %d: %v", fz.srv.PID(), err)
	}
	fz.frozen = false
}

// waitServing waits until the server answers a linearizable read again.
func (fz *freezer) waitServing() {
	fz.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := fz.cli.Get(ctx, "/deadline-test/ping")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			fz.t.Fatalf("the server does not answer again after SIGCONT: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deadlineCase is one entry point caught with the server stopped.
type deadlineCase struct {
	name string
	// setup runs with the server answering; it returns the call to
	// measure, which gets a ctx whose deadline or cancellation comes
	// callDeadline after the call starts.
	setup func(t *testing.T) func(ctx context.Context) error
	// at is where the server stops: "" before the call, or the method (and
	// how many of its requests to let through first) before whose request.
	at   string
	skip int
	// noErr: the call's work was done before the server stopped (a
	// Release whose best-effort revoke hangs): it returns nil, on time.
	noErr bool
}

// overshoot is what one measured call took beyond its deadline.
type overshoot struct {
	name string
	d    time.Duration
}

// watchDone returns when a goroutine that does nothing but wait for ctx saw
// it end: beside a call's own time past its deadline, how late this process
// got to run at all then (the scheduler, other processes on the machine).
func watchDone(ctx context.Context) <-chan time.Time {
	seen := make(chan time.Time, 1)
	go func() { <-ctx.Done(); seen <- time.Now() }()
	return seen
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// overshootReport summarizes what calls took past their deadline or
// cancellation: the median, the largest ten, and the baseline (a call that
// sends nothing).
func overshootReport(over []overshoot) string {
	slices.SortFunc(over, func(a, b overshoot) int { return int(b.d - a.d) })
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	var b strings.Builder
	if len(over) > 0 {
		fmt.Fprintf(&b, "%d calls, time past the deadline or cancellation: median %s, largest first:", len(over), ms(over[len(over)/2].d))
	}
	for i, o := range over {
		if i < 10 || strings.Contains(o.name, "baseline") {
			fmt.Fprintf(&b, "\n  %-72s %9s", o.name, ms(o.d))
		}
	}
	return b.String()
}

// runDeadlineCases runs each case twice, with a deadline and with a
// cancellation, and checks that the call returned the context's error (or
// nil, for noErr) within deadlineSlack. It reports every overshoot,
// largest first.
func runDeadlineCases(t *testing.T, fz *freezer, cases []deadlineCase) {
	var (
		mu   sync.Mutex
		over []overshoot
	)
	for _, c := range cases {
		for _, mode := range []string{"deadline", "cancel"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				fz.waitServing()
				call := c.setup(t)
				freezes := fz.freezes.Load()
				// A call that does not honour its ctx returns when the
				// server answers again: 3 s after its deadline at most.
				thaw := time.AfterFunc(callDeadline+3*time.Second, fz.thaw)
				defer thaw.Stop()
				if c.at == "" {
					fz.freeze()
				} else {
					fz.freezeAt(c.at, c.skip)
				}
				t0 := time.Now()
				var (
					ctx    context.Context
					cancel context.CancelFunc
					want   error
				)
				if mode == "deadline" {
					ctx, cancel = context.WithDeadline(context.Background(), t0.Add(callDeadline))
					want = context.DeadlineExceeded
				} else {
					ctx, cancel = context.WithCancel(context.Background())
					stop := time.AfterFunc(callDeadline, cancel)
					defer stop.Stop()
					want = context.Canceled
				}
				seen := watchDone(ctx)
				err := call(ctx)
				took := time.Since(t0)
				cancel()
				noticed := <-seen
				reached := fz.freezes.Load() > freezes
				fz.thaw()
				if !reached {
					t.Fatalf("the call returned (%v, after %v) before reaching the request the server was to stop at (%s)", err, took, c.at)
				}
				d := took - callDeadline
				mu.Lock()
				over = append(over, overshoot{t.Name(), d})
				mu.Unlock()
				t.Logf("returned %v after the %s (a goroutine waiting on ctx alone: %v): %v",
					d.Round(100*time.Microsecond), mode, (noticed.Sub(t0) - callDeadline).Round(100*time.Microsecond), err)
				switch {
				case c.noErr && err != nil:
					t.Errorf("error %v, want nil (the call's work was done before the server stopped)", err)
				case !c.noErr && !errors.Is(err, want):
					t.Errorf("error %v, want one wrapping %v", err, want)
				}
				if d > deadlineSlack {
					t.Errorf("returned %v after the %s, more than %v; a goroutine waiting on ctx alone noticed its end %v after it (load average %s)",
						d, mode, deadlineSlack, noticed.Sub(t0)-callDeadline, loadAverage())
				}
				if d < -deadlineSlack && !c.noErr {
					t.Errorf("returned %v before the %s: the server was stopped, nothing should have answered", -d, mode)
				}
			})
		}
	}
	t.Log(overshootReport(over))
}

// TestDeadlineEtcd: every entry point of fence-etcd that takes a context
// returns within 50 ms of its deadline or cancellation while the etcd server
// is stopped (SIGSTOP) — before the call, or between two of its requests,
// where a failed acquire cleans up (the revoke of its etcd lease, the delete
// of a key whose transaction's answer never came, the release of the names
// a failed AcquireAll had granted). Those clean-ups go on in the background
// once ctx has ended, and Close waits for them.
func TestDeadlineEtcd(t *testing.T) {
	fz := newFreezer(t)
	prefix := etcdtest.Prefix()
	opt := fenceetcd.WithPrefix(prefix)
	shared, err := fenceetcd.NewLeaseStore(fz.cli, opt, fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	plain, err := fenceetcd.NewLeaseStore(fz.cli, opt)
	if err != nil {
		t.Fatal(err)
	}
	fence, err := fenceetcd.NewFence(fz.cli, opt)
	if err != nil {
		t.Fatal(err)
	}
	res, err := fenceetcd.NewResource(fz.cli, opt)
	if err != nil {
		t.Fatal(err)
	}
	outbox, err := fenceetcd.NewOutbox(fz.cli, opt)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Minute
	bg := context.Background()
	var seq atomic.Int64
	fresh := func(what string) string { return fmt.Sprintf("%s-%d", what, seq.Add(1)) }
	acquire := func(t *testing.T, s *fenceetcd.LeaseStore, name, holder string) leasecore.Grant {
		t.Helper()
		g, err := s.Acquire(bg, name, holder, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	claim := func(t *testing.T) leasecore.Claim {
		t.Helper()
		c := leasecore.Claim{Scope: fresh("scope"), Writer: "w", Token: 10}
		if r, err := fence.Advance(bg, c); err != nil || !r.Accepted {
			t.Fatal(r, err)
		}
		return c
	}
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fresh("batch")
		}
		return out
	}
	// refused is an acquire of a held name: the refusal stands whatever
	// the read of the holder after it finds, and the read (or the revoke
	// before it) gives up at ctx.
	refused := func(ctx context.Context, s *fenceetcd.LeaseStore, name string) error {
		_, err := s.Acquire(ctx, name, "h", ttl)
		if !errors.Is(err, leasecore.ErrHeld) {
			return fmt.Errorf("want ErrHeld: %w", err)
		}
		if ctx.Err() == nil || !strings.Contains(err.Error(), "could not be read: "+ctx.Err().Error()) {
			return fmt.Errorf("want the read of the holder ended by ctx: %w", err)
		}
		return ctx.Err()
	}
	ignore2 := func(_ any, err error) error { return err }
	ignore3 := func(_, _ any, err error) error { return err }

	cases := []deadlineCase{
		// No request at all: how late this process notices a context's end
		// by itself (timer, scheduler, race detector), beside which the
		// other cases' figures are read.
		{name: "baseline_no_request", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
		}},
		{name: "Acquire", setup: func(t *testing.T) func(context.Context) error {
			name := fresh("a")
			return func(ctx context.Context) error { return ignore2(plain.Acquire(ctx, name, "h", ttl)) }
		}},
		{name: "Acquire/transaction_after_grant", at: "/Txn", setup: func(t *testing.T) func(context.Context) error {
			// The Txn never answers: the revoke of the granted lease.
			name := fresh("a")
			return func(ctx context.Context) error { return ignore2(plain.Acquire(ctx, name, "h", ttl)) }
		}},
		{name: "Acquire/refused_revoke", at: "/LeaseRevoke", setup: func(t *testing.T) func(context.Context) error {
			// Refused; the revoke of its etcd lease never answers, nor
			// does the read of the holder after it.
			name := fresh("a")
			acquire(t, plain, name, "other")
			return func(ctx context.Context) error { return refused(ctx, plain, name) }
		}},
		{name: "Acquire/refused_holder_read", at: "/Range", setup: func(t *testing.T) func(context.Context) error {
			name := fresh("a")
			acquire(t, plain, name, "other")
			return func(ctx context.Context) error { return refused(ctx, plain, name) }
		}},
		{name: "Acquire/shared", setup: func(t *testing.T) func(context.Context) error {
			acquire(t, shared, fresh("a"), "hs") // the shared lease exists
			name := fresh("a")
			return func(ctx context.Context) error { return ignore2(shared.Acquire(ctx, name, "hs", ttl)) }
		}},
		{name: "Acquire/shared_transaction_unknown", at: "/Txn", setup: func(t *testing.T) func(context.Context) error {
			// The Txn never answers: the delete of its key if it was
			// applied (unputIfOurs).
			acquire(t, shared, fresh("a"), "hs")
			name := fresh("a")
			return func(ctx context.Context) error { return ignore2(shared.Acquire(ctx, name, "hs", ttl)) }
		}},
		{name: "Acquire/shared_first_grant", at: "/LeaseGrant", setup: func(t *testing.T) func(context.Context) error {
			name, holder := fresh("a"), fresh("holder")
			return func(ctx context.Context) error { return ignore2(shared.Acquire(ctx, name, holder, ttl)) }
		}},
		{name: "AcquireAll/shared", at: "/Txn", setup: func(t *testing.T) func(context.Context) error {
			acquire(t, shared, fresh("a"), "hs")
			ns := names(3)
			return func(ctx context.Context) error { return ignore3(shared.AcquireAll(ctx, ns, "hs", ttl)) }
		}},
		{name: "AcquireAll/shared_second_transaction", at: "/Txn", skip: 1, setup: func(t *testing.T) func(context.Context) error {
			// The first transaction granted 128 names; the second never
			// answers: its keys' deletes and the first's releases.
			acquire(t, shared, fresh("a"), "hs")
			ns := names(fenceetcd.MaxTxnOps + 2)
			return func(ctx context.Context) error { return ignore3(shared.AcquireAll(ctx, ns, "hs", ttl)) }
		}},
		{name: "AcquireAll/per_acquire", at: "/Txn", skip: 1, setup: func(t *testing.T) func(context.Context) error {
			ns := names(3)
			return func(ctx context.Context) error {
				_, errs, err := plain.AcquireAll(ctx, ns, "h", ttl)
				if err != nil {
					return err
				}
				return errs[1]
			}
		}},
		{name: "Renew", setup: func(t *testing.T) func(context.Context) error {
			g := acquire(t, plain, fresh("r"), "h")
			return func(ctx context.Context) error { return ignore2(plain.Renew(ctx, g)) }
		}},
		{name: "Renew/keep_alive", at: "/LeaseKeepAlive", setup: func(t *testing.T) func(context.Context) error {
			g := acquire(t, plain, fresh("r"), "h")
			return func(ctx context.Context) error { return ignore2(plain.Renew(ctx, g)) }
		}},
		{name: "RenewAll/shared_fast", at: "/LeaseKeepAlive", setup: func(t *testing.T) func(context.Context) error {
			holder := fresh("holder")
			gs := []leasecore.Grant{acquire(t, shared, fresh("r"), holder), acquire(t, shared, fresh("r"), holder)}
			if _, _, err := shared.RenewAll(bg, gs); err != nil { // verified: the next one takes the fast path
				t.Fatal(err)
			}
			return func(ctx context.Context) error { return ignore3(shared.RenewAll(ctx, gs)) }
		}},
		{name: "RenewAll/shared_full", setup: func(t *testing.T) func(context.Context) error {
			holder := fresh("holder")
			gs := []leasecore.Grant{acquire(t, shared, fresh("r"), holder), acquire(t, shared, fresh("r"), holder)}
			return func(ctx context.Context) error { return ignore3(shared.RenewAll(ctx, gs)) }
		}},
		{name: "RenewAll/per_acquire", at: "/LeaseKeepAlive", setup: func(t *testing.T) func(context.Context) error {
			gs := []leasecore.Grant{acquire(t, plain, fresh("r"), "h"), acquire(t, plain, fresh("r"), "h")}
			return func(ctx context.Context) error { return ignore3(plain.RenewAll(ctx, gs)) }
		}},
		{name: "Release", setup: func(t *testing.T) func(context.Context) error {
			g := acquire(t, plain, fresh("rel"), "h")
			return func(ctx context.Context) error { return plain.Release(ctx, g) }
		}},
		{name: "Release/revoke", at: "/LeaseRevoke", noErr: true, setup: func(t *testing.T) func(context.Context) error {
			// Released; the revoke of its etcd lease never answers.
			g := acquire(t, plain, fresh("rel"), "h")
			return func(ctx context.Context) error { return plain.Release(ctx, g) }
		}},
		{name: "Release/shared", setup: func(t *testing.T) func(context.Context) error {
			g := acquire(t, shared, fresh("rel"), "hs")
			return func(ctx context.Context) error { return shared.Release(ctx, g) }
		}},
		{name: "Inspect", at: "/LeaseTimeToLive", setup: func(t *testing.T) func(context.Context) error {
			name := fresh("i")
			acquire(t, plain, name, "h")
			return func(ctx context.Context) error { return ignore2(plain.Inspect(ctx, name)) }
		}},
		{name: "WaitFree", setup: func(t *testing.T) func(context.Context) error {
			name := fresh("w")
			acquire(t, plain, name, "h")
			return func(ctx context.Context) error { return plain.WaitFree(ctx, name) }
		}},
		{name: "WaitFree/watch", at: "/Watch", setup: func(t *testing.T) func(context.Context) error {
			name := fresh("w")
			acquire(t, plain, name, "h")
			return func(ctx context.Context) error { return plain.WaitFree(ctx, name) }
		}},
		{name: "AcquireQueued/join_transaction", at: "/Txn", setup: func(t *testing.T) func(context.Context) error {
			// Held; the Txn that joins the line never answers: the revoke
			// of the lease granted for the entry.
			name := fresh("q")
			acquire(t, plain, name, "other")
			return func(ctx context.Context) error { return ignore2(plain.AcquireQueued(ctx, name, "h", ttl)) }
		}},
		{name: "AcquireQueued/shared_join_transaction", at: "/Txn", setup: func(t *testing.T) func(context.Context) error {
			// The same in shared mode: the deletes of the entry and of a
			// key the Txn may have created.
			acquire(t, shared, fresh("a"), "hs")
			name := fresh("q")
			acquire(t, plain, name, "other")
			return func(ctx context.Context) error { return ignore2(shared.AcquireQueued(ctx, name, "hs", ttl)) }
		}},
		{name: "AcquireQueued/in_line", at: "/Watch", setup: func(t *testing.T) func(context.Context) error {
			// In line; the server stops as the watches open: leaving the
			// line (the revoke) goes on in the background.
			name := fresh("q")
			acquire(t, plain, name, "other")
			return func(ctx context.Context) error { return ignore2(plain.AcquireQueued(ctx, name, "h", ttl)) }
		}},
		{name: "List", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(plain.List(ctx, 10)) }
		}},
		{name: "TakeOver", at: "/LeaseGrant", setup: func(t *testing.T) func(context.Context) error {
			name := fresh("t")
			acquire(t, plain, name, "h")
			return func(ctx context.Context) error { return ignore3(plain.TakeOver(ctx, name, "op", ttl)) }
		}},
		{name: "TokenCeiling", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(plain.TokenCeiling(ctx)) }
		}},
		{name: "Fence.Advance", setup: func(t *testing.T) func(context.Context) error {
			c := leasecore.Claim{Scope: fresh("scope"), Writer: "w", Token: 5}
			return func(ctx context.Context) error { return ignore2(fence.Advance(ctx, c)) }
		}},
		{name: "Fence.Commit", setup: func(t *testing.T) func(context.Context) error {
			c := claim(t)
			return func(ctx context.Context) error {
				return ignore3(fence.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(prefix+"-app/x", "v")}}))
			}
		}},
		{name: "Fence.Commit/rejection_log", at: "/Put", setup: func(t *testing.T) func(context.Context) error {
			// Rejected; the Put of its log record never answers.
			c := claim(t)
			c.Token--
			return func(ctx context.Context) error {
				return ignore3(fence.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(prefix+"-app/x", "v")}}))
			}
		}},
		{name: "Fence.Floor", setup: func(t *testing.T) func(context.Context) error {
			c := claim(t)
			return func(ctx context.Context) error { return ignore2(fence.Floor(ctx, c.Scope)) }
		}},
		{name: "Fence.Floors", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(fence.Floors(ctx, 10)) }
		}},
		{name: "Fence.Attempts", setup: func(t *testing.T) func(context.Context) error {
			c := claim(t)
			return func(ctx context.Context) error {
				return ignore2(fence.Attempts(ctx, leasecore.AttemptQuery{Scope: c.Scope, Limit: 10}))
			}
		}},
		{name: "Fence.RejectedAttempts", setup: func(t *testing.T) func(context.Context) error {
			c := claim(t)
			return func(ctx context.Context) error {
				return ignore2(fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: c.Scope, Limit: 10}))
			}
		}},
		{name: "Fence.PruneAttempts", setup: func(t *testing.T) func(context.Context) error {
			c := claim(t)
			return func(ctx context.Context) error { return ignore2(fence.PruneAttempts(ctx, c.Scope, time.Now())) }
		}},
		{name: "Fence.Seal", setup: func(t *testing.T) func(context.Context) error {
			c := claim(t)
			return func(ctx context.Context) error { return ignore3(fence.Seal(ctx, c.Scope, "elsewhere")) }
		}},
		{name: "Fence.Install", setup: func(t *testing.T) func(context.Context) error {
			s := leasecore.ScopeSeal{Scope: fresh("scope"), To: "here", Floor: 7}
			return func(ctx context.Context) error { return ignore3(fence.Install(ctx, s)) }
		}},
		{name: "Resource.Write", setup: func(t *testing.T) func(context.Context) error {
			w := leasecore.Write{Scope: fresh("scope"), Part: "p", Content: "x", Writer: "w", Token: 3}
			return func(ctx context.Context) error { return ignore2(res.Write(ctx, w)) }
		}},
		{name: "Resource.WriteBatch", setup: func(t *testing.T) func(context.Context) error {
			b := leasecore.Batch{Scope: fresh("scope"), Writer: "w", Token: 3,
				Parts: []leasecore.PartContent{{Part: "p", Content: "x"}, {Part: "q", Content: "y"}}}
			return func(ctx context.Context) error { return ignore2(res.WriteBatch(ctx, b)) }
		}},
		{name: "Resource.Floor", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(res.Floor(ctx, "scope")) }
		}},
		{name: "Resource.ReadPart", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore3(res.ReadPart(ctx, "scope", "p")) }
		}},
		{name: "Resource.Attempts", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(res.Attempts(ctx, "scope")) }
		}},
		{name: "Outbox.Pending", setup: func(t *testing.T) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(outbox.Pending(ctx, 10)) }
		}},
		{name: "Outbox.Relay/delete_after_delivery", at: "/DeleteRange", setup: func(t *testing.T) func(context.Context) error {
			// Delivered; the delete of the entry never answers.
			c := claim(t)
			op, err := outbox.Add(c, "topic", []byte("payload"))
			if err != nil {
				t.Fatal(err)
			}
			if r, _, err := fence.Commit(bg, c, fenceetcd.Txn{Then: []clientv3.Op{op}}); err != nil || !r.Accepted {
				t.Fatal(r, err)
			}
			return func(ctx context.Context) error {
				return ignore2(outbox.Relay(ctx, func(context.Context, leasecore.OutboxEntry) error { return nil }))
			}
		}},
	}
	runDeadlineCases(t, fz, cases)

	// The clean-ups the calls left in the background end within 2 s of
	// their call (the server answers again); Close waits for them, so no
	// goroutine of the stores is left for the binary's leak check.
	fz.waitServing()
	t0 := time.Now()
	if err := errors.Join(shared.Close(), plain.Close()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 3*time.Second {
		t.Errorf("Close took %v, more than its 2 s bound", took)
	}
	// Every failed acquire's clean-up has run: no key of this test but
	// those of names it acquired on purpose is left attached to a lease
	// that nobody holds. The shared names went with their revoked leases.
	resp, err := fz.cli.Get(bg, prefix+"/lease/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/batch-") {
			t.Errorf("key %s (holder %s) of a failed AcquireAll left behind", kv.Key, kv.Value)
		}
	}
	// Nor is any AcquireQueued still in a line (shared mode's entries
	// went with Close's revoke; default mode's with their revoked leases).
	if resp, err = fz.cli.Get(bg, prefix+"/queue/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		t.Errorf("entry %s (holder %s) of a failed AcquireQueued left in line", kv.Key, kv.Value)
	}
}

// TestCleanupBeforeLaterAcquire: an acquire (shared mode) whose
// transaction's answer is lost as its ctx ends leaves the delete of the key
// it may have created (unputIfOurs) to the background. That delete matches
// any key of the name with the same holder and shared etcd lease made after
// the failed attempt, so a later acquire of the name through the same store
// must wait for it: else the delete, arriving late, removes the later
// acquire's key, and the holder has a grant of a name nobody holds. Here the
// delete is held back while the later acquire has time to run; the later
// acquire waits for it and its key stands after. A later acquire whose own
// ctx ends first gives up on time.
func TestCleanupBeforeLaterAcquire(t *testing.T) {
	f := newFixture(t)
	key := func(name string) string { return f.layout(t).Lease(name) }
	type unput struct {
		name string
		sent chan struct{} // closed when the delete is about to go out (held)
		hold chan struct{} // the delete waits for this
		done chan struct{} // closed when the server answered it
	}
	newUnput := func(name string) *unput {
		return &unput{name, make(chan struct{}), make(chan struct{}), make(chan struct{})}
	}
	var (
		loseNext atomic.Pointer[context.CancelFunc] // the next Txn is not sent: ctx ends, the answer is "lost"
		mu       sync.Mutex
		unputs   = map[string]*unput{} // by key
		sentN    atomic.Int32
	)
	unputOf := func(req any) *unput {
		r, ok := req.(*etcdserverpb.TxnRequest)
		if !ok || len(r.Success) != 1 {
			return nil
		}
		del := r.Success[0].GetRequestDeleteRange()
		if del == nil {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		return unputs[string(del.Key)]
	}
	cli := dialWith(t, etcdtest.Server(t).Endpoints(),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if !strings.HasSuffix(method, "/Txn") {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			if cancel := loseNext.Swap(nil); cancel != nil {
				(*cancel)()
				return status.Error(codes.Canceled, "test: this transaction's answer was lost (it was not sent)")
			}
			u := unputOf(req)
			if u == nil {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			sentN.Add(1)
			close(u.sent)
			select {
			case <-u.hold:
			case <-ctx.Done():
				return ctx.Err()
			}
			defer close(u.done)
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	s := sharedStore(t, f, cli)
	bg := context.Background()
	if _, err := s.Acquire(bg, "other", "holder-a", time.Minute); err != nil { // the shared lease exists
		t.Fatal(err)
	}
	// failAcquire makes an acquire of name whose answer is lost as its ctx
	// ends, and returns its clean-up, sent and held back.
	failAcquire := func(name string) *unput {
		t.Helper()
		u := newUnput(name)
		mu.Lock()
		unputs[key(name)] = u
		mu.Unlock()
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		loseNext.Store(&cancel)
		t0 := time.Now()
		if _, err := s.Acquire(ctx, name, "holder-a", time.Minute); !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire of %s whose answer was lost as ctx ended: %v, want context.Canceled", name, err)
		}
		if took := time.Since(t0); took > deadlineSlack {
			t.Fatalf("the failed acquire took %v: once ctx has ended its clean-up must not run in the call", took)
		}
		select {
		case <-u.sent: // the clean-up runs in the background
		case <-time.After(5 * time.Second):
			t.Fatalf("no clean-up of the failed acquire of %s was sent", name)
		}
		return u
	}

	// A later acquire with time to spare waits for the clean-up, then
	// acquires, and its key stands.
	u := failAcquire("x")
	type result struct {
		g   leasecore.Grant
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		g, err := s.Acquire(bg, "x", "holder-a", time.Minute)
		done <- result{g, err, time.Now()}
	}()
	time.Sleep(callDeadline) // the later acquire's chance to run ahead of the clean-up
	_, _, createdEarly := f.get(t, key("x"))
	released := time.Now()
	close(u.hold) // the clean-up goes out and ends
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the later acquire did not return after the clean-up ended")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	<-u.done
	if createdEarly || r.at.Before(released) {
		t.Errorf("the later acquire did not wait for the clean-up of the failed one (key created before it: %v; returned %v before it was let through)",
			createdEarly, released.Sub(r.at))
	}
	if v, rev, ok := f.get(t, key("x")); !ok || v != "holder-a" || leasecore.Token(rev) != r.g.Token {
		t.Fatalf("after the clean-up: key x %q, mod revision %d, present %v; want the later acquire's, token %d", v, rev, ok, r.g.Token)
	}
	if _, err := s.Renew(bg, r.g); err != nil {
		t.Fatalf("renew of the later grant: %v", err)
	}

	// A later acquire whose own ctx ends while the clean-up runs gives up
	// on time.
	u = failAcquire("y")
	sctx, scancel := context.WithTimeout(bg, callDeadline)
	t0 := time.Now()
	_, err := s.Acquire(sctx, "y", "holder-a", time.Minute)
	scancel()
	if over := time.Since(t0) - callDeadline; !errors.Is(err, context.DeadlineExceeded) || over > deadlineSlack || over < 0 {
		t.Errorf("acquire while the clean-up runs, 300 ms ctx: %v, %v past the deadline; want DeadlineExceeded within %v", err, over, deadlineSlack)
	}
	close(u.hold)
	if n := sentN.Load(); n != 2 {
		t.Errorf("%d clean-ups sent, want 2 (one per failed acquire)", n)
	}
	// Close waits for the clean-up still running.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-u.done:
	default:
		t.Error("Close returned before the store's clean-up ended")
	}
}
