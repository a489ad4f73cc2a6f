package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers database/sql driver "pgx"
	_ "github.com/lib/pq"              // registers database/sql driver "postgres"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// The deadline promise (package doc): with pgx, or pgx's database/sql
// driver, every call that takes a context returns within pgDeadlineSlack of
// its context's deadline or cancellation, also when the server stops
// answering, clean-up included.
const (
	pgCallDeadline  = 300 * time.Millisecond
	pgDeadlineSlack = 50 * time.Millisecond
)

// holdProxy forwards TCP connections to a PostgreSQL server on 127.0.0.1,
// and can hold: stop forwarding, in both directions, on every connection
// (new ones are accepted and connected, then held too), like a server
// that stopped answering — a stopped process, a hung host — whose kernel
// still accepts connections and acknowledges data. Release forwards again
// what was held.
type holdProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	held   chan struct{} // non-nil while held; closed by release
	closed chan struct{}
	conns  []net.Conn
	wg     sync.WaitGroup
	holds  atomic.Int32 // how often it was held
}

func startHoldProxy(t *testing.T, target string) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln, target: target, closed: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// dsn is dsn with its host and port replaced by the proxy's.
func (p *holdProxy) dsn(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *holdProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
		p.holds.Add(1)
	}
}

func (p *holdProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// gate waits while the proxy is held; false when the proxy closed.
func (p *holdProxy) gate() bool {
	p.mu.Lock()
	held := p.held
	p.mu.Unlock()
	if held == nil {
		return true
	}
	select {
	case <-held:
		return true
	case <-p.closed:
		return false
	}
}

func (p *holdProxy) close() {
	p.release()
	p.mu.Lock()
	select {
	case <-p.closed:
	default:
		close(p.closed)
	}
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

func (p *holdProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		select {
		case <-p.closed:
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		default:
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(s, c) })
		p.wg.Go(func() { p.pump(c, s) })
	}
}

// pump copies from src to dst, holding each chunk while the proxy is held.
func (p *holdProxy) pump(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: the deferred closes pass it on
		}
	}
}

// pgDeadlineEnv is one driver's stores, on pools whose connections all go
// through the proxy, beside a direct pool of the same databases for setup.
type pgDeadlineEnv struct {
	driver string // "pgx" or "pgx-stdlib"
	proxy  *holdProxy

	leases, sessions *fencepg.LeaseStore
	fence            pgopen.Fence
	res              *fencepg.Resource
	outbox           pgopen.Outbox

	pool      *pgxpool.Pool // proxied (pgx)
	sqlDB     *sql.DB       // proxied (pgx-stdlib)
	direct    *pgxpool.Pool // the resource database, not proxied
	directSQL *sql.DB       // the same, on database/sql (pgx-stdlib)
}

func newPgDeadlineEnv(t *testing.T, driver string) *pgDeadlineEnv {
	t.Helper()
	leaseDSN, resDSN := pgtest.CreateDB(t, "dl_lease"), pgtest.CreateDB(t, "dl_res")
	target, err := url.Parse(leaseDSN)
	if err != nil {
		t.Fatal(err)
	}
	e := &pgDeadlineEnv{driver: driver, proxy: startHoldProxy(t, target.Host)}
	ctx := context.Background()
	openPgx := func(dsn string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 8
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	e.direct = openPgx(resDSN)
	directLeases, err := fencepg.NewLeaseStore(openPgx(leaseDSN))
	if err != nil {
		t.Fatal(err)
	}
	directFence, err := fencepg.NewFence(e.direct)
	if err != nil {
		t.Fatal(err)
	}
	directOutbox, err := fencepg.NewOutbox(e.direct)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []func(context.Context) error{directLeases.Migrate, directFence.Migrate, directOutbox.Migrate} {
		if err := m(ctx); err != nil {
			t.Fatal(err)
		}
	}

	leaseVia, resVia := e.proxy.dsn(t, leaseDSN), e.proxy.dsn(t, resDSN)
	switch driver {
	case pgopenPgx:
		e.pool = openPgx(resVia)
		leasePool := openPgx(leaseVia)
		e.leases, err = fencepg.NewLeaseStore(leasePool)
		must(t, err)
		e.sessions, err = fencepg.NewLeaseStore(leasePool, fencepg.WithSharedLeases())
		must(t, err)
		e.fence, err = pgopen.Pool{Pgx: e.pool}.Fence()
		must(t, err)
		e.res, err = fencepg.NewResource(e.pool)
		must(t, err)
		e.outbox, err = pgopen.Pool{Pgx: e.pool}.Outbox()
		must(t, err)
	case pgxStdlib:
		openSQL := func(dsn string) *sql.DB {
			db, err := sql.Open("pgx", dsn)
			must(t, err)
			db.SetMaxOpenConns(8)
			t.Cleanup(func() { _ = db.Close() })
			return db
		}
		e.sqlDB, e.directSQL = openSQL(resVia), openSQL(resDSN)
		leaseDB := openSQL(leaseVia)
		e.leases, err = fencepg.NewLeaseStoreDB(leaseDB)
		must(t, err)
		e.sessions, err = fencepg.NewLeaseStoreDB(leaseDB, fencepg.WithSharedLeases())
		must(t, err)
		e.fence, err = pgopen.Pool{SQL: e.sqlDB}.Fence()
		must(t, err)
		e.res, err = fencepg.NewResourceDB(e.sqlDB)
		must(t, err)
		e.outbox, err = pgopen.Pool{SQL: e.sqlDB}.Outbox()
		must(t, err)
	default:
		t.Fatalf("driver %q", driver)
	}
	// The proxy closes after the pools (cleanups run last-registered
	// first), so no pool waits for a held connection.
	t.Cleanup(e.proxy.release)
	return e
}

const pgopenPgx = "pgx"

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pgDeadlineCase is one entry point caught with the proxy holding.
type pgDeadlineCase struct {
	name    string
	drivers []string // nil: every driver
	// setup runs with the proxy forwarding and returns the call to
	// measure, whose ctx ends pgCallDeadline after the call starts. A
	// case with inside set holds the proxy itself, from inside the call
	// (in fn, in deliver); the others are held before the call starts.
	setup  func(t *testing.T, e *pgDeadlineEnv) func(ctx context.Context) error
	inside bool
	// check, when set, replaces the check that the error wraps the
	// context's (want is context.DeadlineExceeded or context.Canceled).
	check func(err, want error) error
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

// runPgDeadlineCases runs each case with a deadline and with a
// cancellation, and checks the error and that the call returned within
// pgDeadlineSlack; it logs every overshoot, largest first.
func runPgDeadlineCases(t *testing.T, e *pgDeadlineEnv, cases []pgDeadlineCase) {
	type over struct {
		name string
		d    time.Duration
	}
	var overs []over
	for _, c := range cases {
		if c.drivers != nil && !slices.Contains(c.drivers, e.driver) {
			continue
		}
		for _, mode := range []string{"deadline", "cancel"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				call := c.setup(t, e)
				holds := e.proxy.holds.Load()
				if !c.inside {
					e.proxy.hold()
				}
				// A call that does not honour its ctx returns when the
				// server answers again: 3 s after its deadline at most.
				thaw := time.AfterFunc(pgCallDeadline+3*time.Second, e.proxy.release)
				defer thaw.Stop()
				t0 := time.Now()
				var (
					ctx    context.Context
					cancel context.CancelFunc
					want   error
				)
				if mode == "deadline" {
					ctx, cancel = context.WithDeadline(context.Background(), t0.Add(pgCallDeadline))
					want = context.DeadlineExceeded
				} else {
					ctx, cancel = context.WithCancel(context.Background())
					stop := time.AfterFunc(pgCallDeadline, cancel)
					defer stop.Stop()
					want = context.Canceled
				}
				seen := watchDone(ctx)
				err := call(ctx)
				took := time.Since(t0)
				cancel()
				noticed := <-seen
				held := e.proxy.holds.Load() > holds
				e.proxy.release()
				if !held {
					t.Fatalf("the call returned (%v, after %v) before the proxy held", err, took)
				}
				d := took - pgCallDeadline
				overs = append(overs, over{t.Name(), d})
				t.Logf("returned %v after the %s (a goroutine waiting on ctx alone: %v): %v",
					d.Round(100*time.Microsecond), mode, (noticed.Sub(t0) - pgCallDeadline).Round(100*time.Microsecond), err)
				if c.check != nil {
					if cerr := c.check(err, want); cerr != nil {
						t.Error(cerr)
					}
				} else if !errors.Is(err, want) {
					t.Errorf("error %v, want one wrapping %v", err, want)
				}
				if d > pgDeadlineSlack {
					t.Errorf("returned %v after the %s, more than %v; a goroutine waiting on ctx alone noticed its end %v after it (load average %s)",
						d, mode, pgDeadlineSlack, noticed.Sub(t0)-pgCallDeadline, loadAverage())
				}
				if d < -pgDeadlineSlack {
					t.Errorf("returned %v before the %s: the proxy held, nothing should have answered", -d, mode)
				}
			})
		}
	}
	slices.SortFunc(overs, func(a, b over) int { return int(b.d - a.d) })
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	var b strings.Builder
	if len(overs) > 0 {
		fmt.Fprintf(&b, "%d calls, time past the deadline or cancellation: median %s, largest first:", len(overs), ms(overs[len(overs)/2].d))
	}
	for i, o := range overs {
		if i < 10 || strings.Contains(o.name, "baseline") {
			fmt.Fprintf(&b, "\n  %-72s %9s", o.name, ms(o.d))
		}
	}
	t.Log(b.String())
}

// TestDeadlinePg: every entry point of fence-pg that takes a context
// returns within 50 ms of its deadline or cancellation while the server
// stops answering — a proxy between the pools and a real PostgreSQL that
// holds every byte, held before the call or from inside it (in a fenced
// transaction's fn, in a relay's deliver) — on pgx's pool and on
// database/sql with pgx's stdlib driver. Clean-up included: the rollback of
// a fenced transaction whose commit never answers, or whose fn failed
// while the server stopped; the undo of a holder-session acquire whose
// outcome is unknown; the log of a rejection; the UNLISTEN after WaitFree;
// the mark of a delivered outbox entry. lib/pq cannot be bounded this way:
// TestDeadlineLibpq.
func TestDeadlinePg(t *testing.T) {
	for _, driver := range []string{pgopenPgx, pgxStdlib} {
		t.Run(driver, func(t *testing.T) {
			runPgDeadlineCases(t, newPgDeadlineEnv(t, driver), pgDeadlineCases())
		})
	}
}

func pgDeadlineCases() []pgDeadlineCase {
	const ttl = time.Minute
	bg := context.Background()
	var seq atomic.Int64
	fresh := func(what string) string { return fmt.Sprintf("%s-%d", what, seq.Add(1)) }
	acquire := func(t *testing.T, s *fencepg.LeaseStore, name, holder string) leasecore.Grant {
		t.Helper()
		g, err := s.Acquire(bg, name, holder, ttl)
		must(t, err)
		return g
	}
	// claim is a fresh scope whose floor is at the claim's token.
	claim := func(t *testing.T, e *pgDeadlineEnv) leasecore.Claim {
		t.Helper()
		c := leasecore.Claim{Scope: fresh("scope"), Writer: "w", Token: 10}
		if r, err := e.fence.Advance(bg, c); err != nil || !r.Accepted {
			t.Fatal(r, err)
		}
		return c
	}
	ignore2 := func(_ any, err error) error { return err }
	ignore3 := func(_, _ any, err error) error { return err }
	// runTx is the driver's fence's RunTx, with fn.
	runTx := func(ctx context.Context, e *pgDeadlineEnv, c leasecore.Claim, fn func(exec func(string) error) error) error {
		if e.driver == pgopenPgx {
			return ignore2(e.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
				return fn(func(q string) error { _, err := tx.Exec(ctx, q); return err })
			}))
		}
		return ignore2(e.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
			return fn(func(q string) error { _, err := tx.ExecContext(ctx, q); return err })
		}))
	}
	errFn := errors.New("fn's own failure")

	return []pgDeadlineCase{
		// No statement at all: how late this process notices a context's
		// end by itself (timer, scheduler, race detector), beside which the
		// other cases' figures are read.
		{name: "baseline_no_request", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
		}},
		{name: "Acquire", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			name := fresh("a")
			return func(ctx context.Context) error { return ignore2(e.leases.Acquire(ctx, name, "h", ttl)) }
		}},
		{name: "Acquire/holder_sessions_undo", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// The outcome is unknown when ctx ends: the undo goes to the
			// store's queue instead of running past ctx.
			acquire(t, e.sessions, fresh("a"), "hs")
			name := fresh("a")
			return func(ctx context.Context) error { return ignore2(e.sessions.Acquire(ctx, name, "hs", ttl)) }
		}},
		{name: "AcquireAll", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			ns := []string{fresh("b"), fresh("b")}
			return func(ctx context.Context) error { return ignore3(e.leases.AcquireAll(ctx, ns, "h", ttl)) }
		}},
		{name: "AcquireAll/holder_sessions_undo", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			ns := []string{fresh("b"), fresh("b")}
			return func(ctx context.Context) error { return ignore3(e.sessions.AcquireAll(ctx, ns, "hs", ttl)) }
		}},
		{name: "Renew", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			g := acquire(t, e.leases, fresh("r"), "h")
			return func(ctx context.Context) error { return ignore2(e.leases.Renew(ctx, g)) }
		}},
		{name: "Renew/holder_sessions", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			g := acquire(t, e.sessions, fresh("r"), "hs")
			return func(ctx context.Context) error { return ignore2(e.sessions.Renew(ctx, g)) }
		}},
		{name: "RenewAll", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			gs := []leasecore.Grant{acquire(t, e.leases, fresh("r"), "h"), acquire(t, e.leases, fresh("r"), "h")}
			return func(ctx context.Context) error { return ignore3(e.leases.RenewAll(ctx, gs)) }
		}},
		{name: "RenewAll/holder_sessions_fast", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			holder := fresh("holder")
			gs := []leasecore.Grant{acquire(t, e.sessions, fresh("r"), holder), acquire(t, e.sessions, fresh("r"), holder)}
			if _, _, err := e.sessions.RenewAll(bg, gs); err != nil { // verified: the next one takes the fast path
				t.Fatal(err)
			}
			return func(ctx context.Context) error { return ignore3(e.sessions.RenewAll(ctx, gs)) }
		}},
		{name: "Release", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			g := acquire(t, e.leases, fresh("rel"), "h")
			return func(ctx context.Context) error { return e.leases.Release(ctx, g) }
		}},
		{name: "Release/holder_sessions", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			g := acquire(t, e.sessions, fresh("rel"), "hs")
			return func(ctx context.Context) error { return e.sessions.Release(ctx, g) }
		}},
		{name: "Inspect", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.leases.Inspect(ctx, "x")) }
		}},
		{name: "List", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.leases.List(ctx, 10)) }
		}},
		{name: "TakeOver", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			name := fresh("t")
			acquire(t, e.leases, name, "h")
			return func(ctx context.Context) error { return ignore3(e.leases.TakeOver(ctx, name, "op", ttl)) }
		}},
		{name: "WaitFree/listening", inside: false, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			name := fresh("w")
			acquire(t, e.leases, name, "h")
			return func(ctx context.Context) error { return e.leases.WaitFree(ctx, name) }
		}},
		{name: "WaitFree/unlisten", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// The wait is under way (LISTEN and the read answered) when the
			// server stops, just before ctx ends: the UNLISTEN after the
			// wait must not be waited for.
			name := fresh("w")
			acquire(t, e.leases, name, "h")
			return func(ctx context.Context) error {
				stop := time.AfterFunc(pgCallDeadline-30*time.Millisecond, e.proxy.hold)
				defer stop.Stop()
				return e.leases.WaitFree(ctx, name)
			}
		}},
		{name: "LeaseStore.Migrate", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return e.leases.Migrate
		}},
		{name: "LeaseStore.CheckSchema", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return e.leases.CheckSchema
		}},
		{name: "LeaseStore.Preflight", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return e.leases.Preflight
		}},
		{name: "Fence.Advance", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := leasecore.Claim{Scope: fresh("scope"), Writer: "w", Token: 5}
			return func(ctx context.Context) error { return ignore2(e.fence.Advance(ctx, c)) }
		}},
		{name: "Fence.RunTx", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := claim(t, e)
			return func(ctx context.Context) error {
				return runTx(ctx, e, c, func(func(string) error) error { return nil })
			}
		}},
		{name: "Fence.RunTx/first_of_a_token", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := claim(t, e)
			c.Token++ // the floor is raised first
			return func(ctx context.Context) error {
				return runTx(ctx, e, c, func(func(string) error) error { return nil })
			}
		}},
		{name: "Fence.RunTx/commit", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// fn ran; the server stops before the comparison and COMMIT
			// answer: the call ends with ctx, the rollback too.
			c := claim(t, e)
			return func(ctx context.Context) error {
				return runTx(ctx, e, c, func(exec func(string) error) error {
					if err := exec("SELECT 1"); err != nil {
						return err
					}
					e.proxy.hold()
					return nil
				})
			}
		}},
		{name: "Fence.RunTx/statement_in_fn", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := claim(t, e)
			return func(ctx context.Context) error {
				return runTx(ctx, e, c, func(exec func(string) error) error {
					e.proxy.hold()
					return exec("SELECT 1")
				})
			}
		}},
		{name: "Fence.RunTx/fn_fails_rollback", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// fn fails on its own while the server has stopped: the
			// rollback that follows is bounded by ctx, and the call
			// returns fn's error.
			c := claim(t, e)
			return func(ctx context.Context) error {
				return runTx(ctx, e, c, func(exec func(string) error) error {
					e.proxy.hold()
					return errFn
				})
			}
		}, check: func(err, want error) error {
			if !errors.Is(err, errFn) {
				return fmt.Errorf("error %v, want fn's", err)
			}
			return nil
		}},
		{name: "Fence.Commit/rejection_log", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// The caller's transaction is on a direct pool; the Fence's
			// own pool, which logs the rejection, is held.
			c := claim(t, e)
			c.Token--
			rejected := func(r leasecore.Result, err error) error {
				if err == nil || r.Accepted || r.Floor != c.Token+1 {
					return fmt.Errorf("want the rejection (floor %d) with an error: %+v, %w", c.Token+1, r, err)
				}
				return err
			}
			if e.driver == pgopenPgx {
				tx, err := e.direct.Begin(bg)
				must(t, err)
				t.Cleanup(func() { _ = tx.Rollback(bg) })
				return func(ctx context.Context) error { return rejected(e.fence.Pgx.Commit(ctx, tx, c)) }
			}
			return func(ctx context.Context) error {
				tx, err := e.directSQL.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				return rejected(e.fence.SQL.Commit(ctx, tx, c))
			}
		}},
		{name: "Fence.Commit", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// The caller's transaction begins; then the server stops, and
			// the comparison and COMMIT never answer.
			c := claim(t, e)
			if e.driver == pgopenPgx {
				return func(ctx context.Context) error {
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback(ctx) }()
					e.proxy.hold()
					return ignore2(e.fence.Pgx.Commit(ctx, tx, c))
				}
			}
			return func(ctx context.Context) error {
				// database/sql binds the transaction to BeginTx's ctx,
				// which bounds its COMMIT and ROLLBACK: the same ctx (see
				// FenceDB.Commit).
				tx, err := e.sqlDB.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				e.proxy.hold()
				return ignore2(e.fence.SQL.Commit(ctx, tx, c))
			}
		}},
		{name: "Fence.SendBatch", drivers: []string{pgopenPgx}, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := claim(t, e)
			return func(ctx context.Context) error {
				b := &pgx.Batch{}
				b.Queue("SELECT 1")
				return ignore2(e.fence.Pgx.SendBatch(ctx, e.pool, c, b))
			}
		}},
		{name: "Fence.Floor", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.fence.Floor(ctx, "scope")) }
		}},
		{name: "Fence.Floors", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.fence.Floors(ctx, 10)) }
		}},
		{name: "Fence.Attempts", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error {
				return ignore2(e.fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "scope", Limit: 10}))
			}
		}},
		{name: "Fence.RejectedAttempts", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error {
				return ignore2(e.fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "scope", Limit: 10}))
			}
		}},
		{name: "Fence.PruneAttempts", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.fence.PruneAttempts(ctx, "scope", time.Now())) }
		}},
		{name: "Fence.Seal", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := claim(t, e)
			if e.driver == pgopenPgx {
				tx, err := e.pool.Begin(bg)
				must(t, err)
				t.Cleanup(func() { _ = tx.Rollback(bg) })
				return func(ctx context.Context) error { return ignore2(e.fence.Pgx.Seal(ctx, tx, c.Scope, "elsewhere")) }
			}
			return func(ctx context.Context) error {
				tx, err := e.sqlDB.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				return ignore2(e.fence.SQL.Seal(ctx, tx, c.Scope, "elsewhere"))
			}
		}},
		{name: "Fence.Install", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			s := leasecore.ScopeSeal{Scope: fresh("scope"), To: "here", Floor: 7}
			if e.driver == pgopenPgx {
				tx, err := e.pool.Begin(bg)
				must(t, err)
				t.Cleanup(func() { _ = tx.Rollback(bg) })
				return func(ctx context.Context) error { return ignore2(e.fence.Pgx.Install(ctx, tx, s)) }
			}
			return func(ctx context.Context) error {
				tx, err := e.sqlDB.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				return ignore2(e.fence.SQL.Install(ctx, tx, s))
			}
		}},
		{name: "Fence.Migrate", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return e.fence.Migrate
		}},
		{name: "Fence.Preflight", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return e.fence.Preflight
		}},
		{name: "Resource.Write", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			w := leasecore.Write{Scope: fresh("scope"), Part: "p", Content: "x", Writer: "w", Token: 3}
			return func(ctx context.Context) error { return ignore2(e.res.Write(ctx, w)) }
		}},
		{name: "Resource.WriteBatch", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			b := leasecore.Batch{Scope: fresh("scope"), Writer: "w", Token: 3,
				Parts: []leasecore.PartContent{{Part: "p", Content: "x"}, {Part: "q", Content: "y"}}}
			return func(ctx context.Context) error { return ignore2(e.res.WriteBatch(ctx, b)) }
		}},
		{name: "Resource.Floor", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.res.Floor(ctx, "scope")) }
		}},
		{name: "Resource.ReadPart", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore3(e.res.ReadPart(ctx, "scope", "p")) }
		}},
		{name: "Resource.Attempts", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.res.Attempts(ctx, "scope")) }
		}},
		{name: "Outbox.Add", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			c := claim(t, e)
			if e.driver == pgopenPgx {
				return func(ctx context.Context) error {
					return ignore2(e.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
						e.proxy.hold()
						_, err := e.outbox.Pgx.Add(ctx, tx, c, "t", []byte("p"))
						return err
					}))
				}
			}
			return func(ctx context.Context) error {
				return ignore2(e.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
					e.proxy.hold()
					_, err := e.outbox.SQL.Add(ctx, tx, c, "t", []byte("p"))
					return err
				}))
			}
		}},
		{name: "Outbox.Relay/mark", inside: true, setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			// Delivered; the server stops before the mark answers.
			c := claim(t, e)
			var err error
			if e.driver == pgopenPgx {
				_, err = e.fence.Pgx.RunTx(bg, c, func(tx pgx.Tx) error { _, err := e.outbox.Pgx.Add(bg, tx, c, "t", []byte("p")); return err })
			} else {
				_, err = e.fence.SQL.RunTx(bg, c, func(tx *sql.Tx) error { _, err := e.outbox.SQL.Add(bg, tx, c, "t", []byte("p")); return err })
			}
			must(t, err)
			return func(ctx context.Context) error {
				return ignore2(e.outbox.Relay(ctx, func(context.Context, leasecore.OutboxEntry) error {
					e.proxy.hold()
					return nil
				}))
			}
		}},
		{name: "Outbox.Pending", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.outbox.Pending(ctx, 10)) }
		}},
		{name: "Outbox.PruneDelivered", setup: func(t *testing.T, e *pgDeadlineEnv) func(context.Context) error {
			return func(ctx context.Context) error { return ignore2(e.outbox.PruneDelivered(ctx, time.Now())) }
		}},
	}
}

// TestDeadlineLibpq shows why fencepg's deadline promise excludes lib/pq,
// as the package doc says: lib/pq answers a context's end by sending the
// server a cancel request on a new connection, and its call returns only
// once the server answers on the statement's own connection; BEGIN, COMMIT
// and ROLLBACK are sent with no cancellation at all. Against a server that
// stopped answering (the proxy holds) a call on a lib/pq pool returns only
// when the server answers again, whatever its context — here 1 s after a
// 300 ms deadline, when the proxy lets go — while the same call on pgx's
// database/sql driver returns within 50 ms of the deadline. If this test
// fails because lib/pq returned on time, lib/pq changed: revise the
// package doc.
func TestDeadlineLibpq(t *testing.T) {
	const holdFor = time.Second
	dsn := pgtest.CreateDB(t, "dl_libpq")
	target, err := url.Parse(dsn)
	must(t, err)
	proxy := startHoldProxy(t, target.Host)
	bg := context.Background()
	for _, tc := range []struct {
		driver, sqlDriver string
		bounded           bool
	}{
		{"lib/pq", "postgres", false},
		{"pgx-stdlib", "pgx", true},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			db, err := sql.Open(tc.sqlDriver, proxy.dsn(t, dsn))
			must(t, err)
			db.SetMaxOpenConns(4)
			t.Cleanup(func() { _ = db.Close() })
			leases, err := fencepg.NewLeaseStoreDB(db)
			must(t, err)
			fence, err := fencepg.NewFenceDB(db)
			must(t, err)
			must(t, leases.Migrate(bg))
			must(t, fence.Migrate(bg))
			c := leasecore.Claim{Scope: "s-" + tc.sqlDriver, Writer: "w", Token: 1}
			if r, err := fence.Advance(bg, c); err != nil || !r.Accepted {
				t.Fatal(r, err)
			}
			for _, call := range []struct {
				name string
				f    func(ctx context.Context) error
			}{
				{"Acquire", func(ctx context.Context) error {
					_, err := leases.Acquire(ctx, "x-"+tc.sqlDriver, "h", time.Minute)
					return err
				}},
				{"RunTx", func(ctx context.Context) error { // its BEGIN
					_, err := fence.RunTx(ctx, c, func(*sql.Tx) error { return nil })
					return err
				}},
			} {
				t.Run(call.name, func(t *testing.T) {
					proxy.hold()
					t0 := time.Now()
					let := time.AfterFunc(holdFor, proxy.release)
					defer let.Stop()
					ctx, cancel := context.WithDeadline(bg, t0.Add(pgCallDeadline))
					err := call.f(ctx)
					took := time.Since(t0)
					cancel()
					proxy.release()
					t.Logf("%s on %s, %v deadline, server held %v: returned after %v: %v",
						call.name, tc.driver, pgCallDeadline, holdFor, took.Round(time.Millisecond), err)
					switch {
					case tc.bounded && took > pgCallDeadline+pgDeadlineSlack:
						t.Errorf("returned %v after the deadline, more than %v", took-pgCallDeadline, pgDeadlineSlack)
					case tc.bounded && !errors.Is(err, context.DeadlineExceeded):
						t.Errorf("error %v, want one wrapping context.DeadlineExceeded", err)
					case !tc.bounded && took < holdFor:
						t.Errorf("returned after %v, before the server answered again (%v): lib/pq now honours the "+
							"deadline against a server that stopped answering; revise fencepg's package doc", took, holdFor)
					}
				})
			}
		})
	}
}
