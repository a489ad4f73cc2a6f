// Package pgconformance provides the PostgreSQL harness for the leasefence
// conformance suite: fencepg's lease store and fenced resource, pgcontrol's
// negative controls, a long transaction (F2), a commit gap (F6b) and a
// lock-wait probe (F6b), holder processes (F4, F5), a server crash (F8),
// the fenced outbox (fencepg.Outbox, F9b) and a second resource database to
// move scopes to (F17, moves.go), on either driver.
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, pgconformance.New(pgconformance.Config{
//			Driver: "pgx", LeaseDSN: leaseDSN, ResourceDSN: resourceDSN,
//		}))
//	}
//
// Every harness migrates both databases and empties every table, so each
// case starts from nothing. The two databases must be used by nothing else
// while the suite runs.
package pgconformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// The drivers Config.Driver names.
const (
	DriverPgx   = pgopen.Pgx   // pgx/v5 through *pgxpool.Pool
	DriverLibpq = pgopen.Libpq // lib/pq through database/sql
)

// Config says where the two databases are and which driver to use.
type Config struct {
	Driver      string // DriverPgx or DriverLibpq
	LeaseDSN    string // the lease database (table lease)
	ResourceDSN string // the resource database (fence_floor, report_part, write_attempt, published)

	// HolderArgs are the arguments that make the running binary a holder
	// process (F4, F5), e.g. []string{"-test.run=^$"} for a test binary
	// whose TestMain calls HolderMain, or []string{"holder"} for the lab.
	// Nil declares holder processes absent.
	HolderArgs []string

	// Cluster is the throwaway cluster both databases live on. When set
	// and local, F8 crashes it with RestartImmediate; nil or an external
	// server declares crash-and-restart absent.
	Cluster *pgtemp.Cluster

	// Pooler, when not empty, says that both DSNs go through a connection
	// pooler in transaction mode and names it in the output ("PgBouncer
	// 1.18.0, pool_mode=transaction"). Lease stores, the holders' too, are
	// then made with fencepg.WithoutNotifications: a LISTEN does not stay
	// with a client of such a pooler, so F11's campaigners poll. With pgx,
	// the DSNs must choose a pooler-safe default_query_exec_mode (exec or
	// simple_protocol).
	Pooler string

	// SharedLeases runs the suite with fencepg.WithSharedLeases: every
	// lease store the harness opens, its holder processes' and F16's
	// replicated deployments' included, hangs all names of one holder and
	// TTL on one session row, and F2's acquire inside a long transaction
	// runs that mode's statement. The traits' name then ends in
	// "/holder-sessions". The mode needs no trait of its own: like etcd's
	// shared leases it keeps the Lease contract the suite checks (a holder's
	// names of different TTLs on different sessions, its own live name
	// refused, a lost acquire's answer undone).
	SharedLeases bool

	// DefaultAttemptLog runs the suite with fencepg's default attempt log
	// (rejected checks only) on every fence and fenced resource, instead
	// of leasecore.LogAll. Only then do the statements users get by
	// default run: Resource.Write's fast path and Fence's check that only
	// reads a floor already equal to the token. LogAll makes every check
	// the full one, which also inserts the accepted attempt's row. The traits declare the mode
	// (conformance.Traits.AttemptLog); the traits' name ends in
	// "/default-attempt-log".
	DefaultAttemptLog bool

	// Patroni makes F16's replicated deployments three-member Patroni
	// clusters (pgtemp.StartPatroni, of Config.Cluster's binaries) instead
	// of a primary and a standby the case promotes itself: Patroni decides
	// whom to promote when the leader's host is killed. Needs Debian's
	// patroni and etcd-server packages (or LEASEFENCE_PATRONI and
	// LEASEFENCE_ETCD).
	Patroni bool
}

// New returns the suite's factory for cfg. Each call of the factory opens
// its own pools, migrates both databases, empties every table, and returns
// a harness; its Close closes every pool it opened.
func New(cfg Config) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		return newHarness(ctx, cfg)
	}
}

const pkg = "pgconformance"

// attemptLog is the attempt log of every fence and fenced resource the
// harness opens, its holder processes' included: leasecore.LogAll (the
// suite reads the whole log, and the lab prints it), or fencepg's default,
// rejected checks only, with Config.DefaultAttemptLog.
func attemptLog(defaultLog bool) leasecore.AttemptLog {
	if defaultLog {
		return leasecore.LogRejected
	}
	return leasecore.LogAll
}

// logOption is attemptLog as the option of fencepg's constructors.
func (cfg Config) logOption() fencepg.Option {
	return fencepg.WithAttemptLog(attemptLog(cfg.DefaultAttemptLog))
}

// Pool sizes. A lease client has exactly one connection, so that 16 clients
// racing behind the suite's barrier are 16 sessions on the server.
// Resources get a few: F6b runs a write that holds its transaction open
// while another client writes and the probe looks.
const (
	leaseConns    = 1
	resourceConns = 3
	adminConns    = 1
)

type harness struct {
	cfg      Config
	resAdmin dbx.DB // migrations, truncation and the lock-wait probe
	moves    moves  // F17's second resource database (moves.go)

	mu      sync.Mutex
	closers []func() error // run in reverse order by Close
	closed  bool
}

var (
	_ conformance.Harness            = (*harness)(nil)
	_ conformance.LongTransactions   = (*harness)(nil)
	_ conformance.CommitGapResources = (*harness)(nil)
	_ conformance.LockWaitProbe      = (*harness)(nil)
	_ conformance.NegativeControls   = (*harness)(nil)
	_ conformance.HolderProcesses    = (*harness)(nil)
	_ conformance.CrashRestarter     = (*harness)(nil)
	_ conformance.UserDataResources  = (*harness)(nil)
	_ conformance.CheckFirstControl  = (*harness)(nil)
)

func newHarness(ctx context.Context, cfg Config) (_ *harness, err error) {
	h := &harness{cfg: cfg}
	defer func() {
		if err != nil {
			_ = h.Close()
		}
	}()
	leaseAdmin, err := h.open(ctx, cfg.LeaseDSN, adminConns)
	if err != nil {
		return nil, err
	}
	resAdmin, err := h.open(ctx, cfg.ResourceDSN, adminConns)
	if err != nil {
		return nil, err
	}
	h.resAdmin = dbOf(resAdmin)

	leases, err := leaseAdmin.LeaseStore(cfg.leaseOptions()...)
	if err != nil {
		return nil, err
	}
	controls, err := resAdmin.Controls()
	if err != nil {
		return nil, err
	}
	if err := leases.Migrate(ctx); err != nil {
		return nil, err
	}
	if err := controls.Migrate(ctx); err != nil { // fencepg's resource tables too
		return nil, err
	}
	if err := migrateUser(ctx, h.resAdmin); err != nil {
		return nil, err
	}
	for _, t := range []struct {
		db   dbx.DB
		stmt string
	}{{dbOf(leaseAdmin), pgsql.TruncateLease}, {h.resAdmin, pgsql.TruncateResource}} {
		if _, err := t.db.Exec(ctx, t.stmt); err != nil {
			return nil, pgstore.MapError(ctx, pkg, "truncate", err)
		}
	}
	return h, nil
}

// Traits implements conformance.Harness.
func (h *harness) Traits() conformance.Traits {
	absent := map[conformance.Ability]string{}
	if h.cfg.HolderArgs == nil {
		absent[conformance.AbilityHolderProcesses] = "pgconformance.Config.HolderArgs is not set: this binary cannot re-execute itself as a holder"
	}
	switch {
	case h.cfg.Cluster == nil:
		absent[conformance.AbilityCrashRestart] = "pgconformance.Config.Cluster is not set: no server this harness may crash"
	case h.cfg.Cluster.External():
		absent[conformance.AbilityCrashRestart] = "external server (LEASEFENCE_PG_URL): the suite does not crash a server it did not start"
	}
	h.declareReplicas(absent) // replicas.go
	name := "postgres/" + h.cfg.Driver
	if h.cfg.SharedLeases {
		name += "/holder-sessions"
	}
	if h.cfg.DefaultAttemptLog {
		name += "/default-attempt-log"
	}
	if h.cfg.Pooler != "" {
		name += " behind " + h.cfg.Pooler
	}
	return conformance.Traits{
		Name:       name,
		MinTTL:     fencepg.MinTTL,
		TokenStep:  1,
		AttemptLog: attemptLog(h.cfg.DefaultAttemptLog),
		Absent:     absent,
	}
}

// OpenLease implements conformance.Harness: a lease store on a new pool of
// exactly one connection, already established.
func (h *harness) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	c, err := h.open(ctx, h.cfg.LeaseDSN, leaseConns)
	if err != nil {
		return nil, err
	}
	return c.LeaseStore(h.cfg.leaseOptions()...)
}

// leaseOptions are the options of every lease store of cfg: behind a
// transaction pooler, no LISTEN; holder sessions when asked for.
func (cfg Config) leaseOptions() []fencepg.Option {
	var opts []fencepg.Option
	if cfg.Pooler != "" {
		opts = append(opts, fencepg.WithoutNotifications())
	}
	if cfg.SharedLeases {
		opts = append(opts, fencepg.WithSharedLeases())
	}
	return opts
}

// OpenResource implements conformance.Harness: a fenced resource on a new
// pool.
func (h *harness) OpenResource(ctx context.Context) (conformance.Resource, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	return c.Resource(h.cfg.logOption())
}

// FencedResourceWithGap implements conformance.CommitGapResources with
// fence-pg's commit-gap test hook (internal/commitgap): the fence
// statement, gap, then COMMIT.
func (h *harness) FencedResourceWithGap(ctx context.Context, gap conformance.Gap) (conformance.Resource, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	res, err := c.Resource(h.cfg.logOption())
	if err != nil {
		return nil, err
	}
	return commitgap.Wrap(res, commitgap.Gap(gap)), nil
}

// LockWaits implements conformance.LockWaitProbe from pg_stat_activity: the
// sessions of the resource database whose statement on fence_floor waits
// for a lock.
func (h *harness) LockWaits(ctx context.Context) ([]string, error) {
	const op = "lock waits"
	rows, err := h.resAdmin.Query(ctx, pgsql.LockWaits)
	if err != nil {
		return nil, pgstore.MapError(ctx, pkg, op, err)
	}
	defer rows.Close()
	var waits []string
	for rows.Next() {
		var typ, event string
		if err := rows.Scan(&typ, &event); err != nil {
			return nil, pgstore.MapError(ctx, pkg, op, err)
		}
		waits = append(waits, fmt.Sprintf("wait_event_type=%s wait_event=%s", typ, event))
	}
	return waits, pgstore.MapError(ctx, pkg, op, rows.Err())
}

// UnfencedResource implements conformance.NegativeControls.
func (h *harness) UnfencedResource(ctx context.Context) (conformance.Resource, error) {
	return h.control(ctx, func(c *pgcontrol.Controls) *pgcontrol.Resource { return c.Unfenced() })
}

// CheckThenWriteResource implements conformance.NegativeControls.
func (h *harness) CheckThenWriteResource(ctx context.Context, gap conformance.Gap) (conformance.Resource, error) {
	return h.control(ctx, func(c *pgcontrol.Controls) *pgcontrol.Resource { return c.CheckThenWrite(gap) })
}

// RowFencedResource implements conformance.NegativeControls.
func (h *harness) RowFencedResource(ctx context.Context) (conformance.Resource, error) {
	return h.control(ctx, func(c *pgcontrol.Controls) *pgcontrol.Resource { return c.RowFenced() })
}

// IdempotentPublisher implements conformance.NegativeControls.
func (h *harness) IdempotentPublisher(ctx context.Context) (conformance.Resource, error) {
	return h.control(ctx, func(c *pgcontrol.Controls) *pgcontrol.Resource { return c.IdempotentPublisher() })
}

func (h *harness) control(ctx context.Context, pick func(*pgcontrol.Controls) *pgcontrol.Resource) (conformance.Resource, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	controls, err := c.Controls()
	if err != nil {
		return nil, err
	}
	return pick(controls), nil
}

// BeginLongTransaction implements conformance.LongTransactions: BEGIN on a
// pool of its own with one connection.
func (h *harness) BeginLongTransaction(ctx context.Context) (conformance.LongTransaction, error) {
	c, err := h.open(ctx, h.cfg.LeaseDSN, 1)
	if err != nil {
		return nil, err
	}
	// database/sql rolls a transaction back when the context of BeginTx
	// ends; this one must live until Rollback (or Close).
	tx, err := dbOf(c).Begin(context.WithoutCancel(ctx))
	if err != nil {
		return nil, pgstore.MapError(ctx, pkg, "begin", err)
	}
	// Registered after the pool, so it runs before the pool closes: a pgx
	// pool's Close waits for a connection held by an open transaction.
	rollback := func() error {
		if err := tx.Rollback(context.Background()); err != nil && !isTxDone(err) {
			return err
		}
		return nil
	}
	if !h.onClose(rollback) {
		_ = rollback()
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	return longTx{tx, h.cfg.SharedLeases}, nil
}

// longTx is one open transaction on the lease database.
type longTx struct {
	tx       dbx.Tx
	sessions bool // Config.SharedLeases: acquire with that mode's statement
}

func (l longTx) Now(ctx context.Context) (time.Time, error) { return l.time(ctx, pgsql.Now) }

func (l longTx) ClockNow(ctx context.Context) (time.Time, error) { return l.time(ctx, pgsql.ClockNow) }

func (l longTx) time(ctx context.Context, query string) (time.Time, error) {
	var t time.Time
	err := l.tx.QueryRow(ctx, query).Scan(&t)
	return t, pgstore.MapError(ctx, pkg, "long transaction", err)
}

// Acquire runs fencepg's acquire statement — the same text and the same
// runner, of the harness's mode — inside the transaction, where now() is
// the transaction's start.
func (l longTx) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if l.sessions {
		return pgstore.AcquireSession(ctx, l.tx, pgsql.AcquireSession, pkg, name, holder, ttl, fencepg.MinTTL, rand.Int64())
	}
	return pgstore.Acquire(ctx, l.tx, pgsql.Acquire, pkg, name, holder, ttl, fencepg.MinTTL)
}

func (l longTx) Rollback(ctx context.Context) error {
	return pgstore.MapError(ctx, pkg, "rollback", l.tx.Rollback(ctx))
}

// isTxDone reports the error of rolling back a transaction that already
// ended (both drivers).
func isTxDone(err error) bool {
	return errors.Is(err, sql.ErrTxDone) || errors.Is(err, pgx.ErrTxClosed)
}

// Close implements conformance.Harness: it closes every pool the harness
// opened, rolling back long transactions first.
func (h *harness) Close() error {
	h.mu.Lock()
	closers := h.closers
	h.closers, h.closed = nil, true
	h.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		errs = append(errs, closers[i]())
	}
	return errors.Join(errs...)
}

// open opens a pool with the configured driver and registers it with
// Close. Pools open concurrently (the suite may open its 16 lease clients
// at once); one opened while Close runs is closed at once.
func (h *harness) open(ctx context.Context, dsn string, maxConns int) (pgopen.Pool, error) {
	p, err := pgopen.Open(ctx, h.cfg.Driver, dsn, maxConns)
	if err != nil {
		return pgopen.Pool{}, pgstore.MapError(ctx, pkg, "open", err)
	}
	if !h.onClose(p.Close) {
		_ = p.Close()
		return pgopen.Pool{}, fmt.Errorf("%s: harness is closed", pkg)
	}
	return p, nil
}

// dbOf is the pool as fence-pg's internal dbx.DB, for the harness's own
// statements. It is not a method of pgopen.Pool because pgopen is
// importable from outside fence-pg, where dbx is not.
func dbOf(p pgopen.Pool) dbx.DB {
	if p.Pgx != nil {
		return dbx.FromPool(p.Pgx)
	}
	return dbx.FromSQL(p.SQL)
}

// onClose registers f to run in Close; false when Close already ran.
func (h *harness) onClose(f func() error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.closers = append(h.closers, f)
	return true
}
