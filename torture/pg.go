package torture

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The lease and the user data live in two databases of one cluster, as the
// lab's lease26 and res26 do (examples/lease-fencing/cmd/lab): the resource
// cannot read the lease table by accident.
const (
	pgLeaseDB = "torture_lease"
	pgResDB   = "torture_res"
)

// pgLeaseDDL is the naive lease's table (flavorNaive): the lease table of
// the lease-fencing article (SOURCES.md), in this package's own schema.
const pgLeaseDDL = `CREATE SCHEMA IF NOT EXISTS torture;
CREATE TABLE IF NOT EXISTS torture.lease (
  name text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL CHECK (token > 0),
  expires_at timestamptz NOT NULL)`

// pgResourceDDL is the user data every flavor writes — two tables, one row
// per (scope, part) — and the floor of this package's own fences
// (flavorStrict, flavorNaive). The library's fence keeps its floor in
// leasefence.fence_floor, created by fencepg's Migrate.
const pgResourceDDL = `CREATE SCHEMA IF NOT EXISTS torture;
CREATE TABLE IF NOT EXISTS torture.run (
  scope text, part text, token bigint NOT NULL, content text NOT NULL, writer text NOT NULL,
  PRIMARY KEY (scope, part));
CREATE TABLE IF NOT EXISTS torture.line (
  scope text, part text, token bigint NOT NULL, content text NOT NULL, writer text NOT NULL,
  PRIMARY KEY (scope, part));
CREATE TABLE IF NOT EXISTS torture.fence_floor (scope text PRIMARY KEY, max_token bigint NOT NULL)`

// pgServer is a throwaway cluster (pgtemp) with both databases migrated.
type pgServer struct {
	cluster *pgtemp.Cluster
	reads   *pgxpool.Pool // the parent's reads, straight to the server
	label   string
}

// nonDurableSettings make a cluster lose acknowledged commits in an
// immediate stop — for the naive control only. synchronous_commit=off
// acknowledges a commit before its WAL leaves the server's buffers;
// wal_writer_delay=10s (its maximum) keeps the WAL writer from writing
// them out on its own for longer than any history lasts, so what a crash
// loses is whatever the last partly filled WAL page held (the WAL writer
// still writes full pages when woken); full_page_writes=off keeps whole
// page images from filling pages faster. An operating-system crash is not
// simulated: WAL written to the kernel survives a process crash.
var nonDurableSettings = [][2]string{
	{"synchronous_commit", "off"},
	{"wal_writer_delay", "10s"},
	{"full_page_writes", "off"},
}

// startPG starts a cluster, creates both databases and migrates them: the
// library's tables (fencepg's Migrate) and this package's. nonDurable
// starts it with nonDurableSettings.
func startPG(ctx context.Context, nonDurable bool) (*pgServer, error) {
	var opts []pgtemp.Option
	label := "pg"
	if nonDurable {
		label = "pg (synchronous_commit=off)"
		for _, s := range nonDurableSettings {
			opts = append(opts, pgtemp.WithSetting(s[0], s[1]))
		}
	}
	c, err := pgtemp.Start(ctx, opts...)
	if err != nil {
		return nil, err
	}
	s := &pgServer{cluster: c, label: label}
	if err := migratePG(ctx, c.CreateDatabase, c.DSN); err != nil {
		_ = c.Stop()
		return nil, err
	}
	if s.reads, err = pgxpool.New(ctx, c.DSN(pgResDB)+"&pool_max_conns=8&connect_timeout=2"); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return s, nil
}

// migratePG creates both databases with create and migrates them, reaching
// each at dsn(database).
func migratePG(ctx context.Context, create func(context.Context, string) error, dsn func(string) string) error {
	for _, db := range []string{pgLeaseDB, pgResDB} {
		if err := create(ctx, db); err != nil {
			return err
		}
	}
	leasePool, err := pgxpool.New(ctx, dsn(pgLeaseDB))
	if err != nil {
		return err
	}
	defer leasePool.Close()
	resPool, err := pgxpool.New(ctx, dsn(pgResDB))
	if err != nil {
		return err
	}
	defer resPool.Close()
	leases, err := fencepg.NewLeaseStore(leasePool)
	if err != nil {
		return err
	}
	fence, err := fencepg.NewFence(resPool)
	if err != nil {
		return err
	}
	if err := errors.Join(leases.Migrate(ctx), fence.Migrate(ctx)); err != nil {
		return err
	}
	if _, err := leasePool.Exec(ctx, pgLeaseDDL); err != nil {
		return fmt.Errorf("torture lease schema: %w", err)
	}
	if _, err := resPool.Exec(ctx, pgResourceDDL); err != nil {
		return fmt.Errorf("torture resource schema: %w", err)
	}
	return nil
}

func (s *pgServer) name() string { return s.label }

func (s *pgServer) backend() string { return "pg" }

func (s *pgServer) targets() []string {
	return []string{s.cluster.Host() + ":" + strconv.Itoa(s.cluster.Port())}
}

// holderSpec points a holder's connections at its proxy.
func (s *pgServer) holderSpec(proxyAddrs []string) holderSpec {
	return holderSpec{Backend: "pg",
		LeaseDSN:    viaProxy(s.cluster.DSN(pgLeaseDB), proxyAddrs[0], 3),
		ResourceDSN: viaProxy(s.cluster.DSN(pgResDB), proxyAddrs[0], 4)}
}

// viaProxy is dsn with its host replaced by the proxy's address.
func viaProxy(dsn, addr string, conns int) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err) // pgtemp's own DSN
	}
	u.Host = addr
	q := u.Query()
	q.Set("connect_timeout", "2")
	q.Set("pool_max_conns", strconv.Itoa(conns))
	u.RawQuery = q.Encode()
	return u.String()
}

// crash stops the server immediately (SIGQUIT to the postmaster: what
// pg_ctl stop -m immediate does, no checkpoint) and starts it again on
// the same data directory, which recovers from the WAL.
func (s *pgServer) crash(ctx context.Context) (time.Duration, string, error) {
	d, err := s.cluster.RestartImmediate(ctx)
	return d, "immediate stop (SIGQUIT to the postmaster), restart on the same data directory", err
}

func (s *pgServer) read(ctx context.Context, scope string, fl flavor) (Snapshot, error) {
	return readPG(ctx, s.reads, scope, fl)
}

// readPG reads the scope's floor and both tables in one statement, so in
// one snapshot.
func readPG(ctx context.Context, reads *pgxpool.Pool, scope string, fl flavor) (Snapshot, error) {
	floorTable := "leasefence.fence_floor"
	if fl.ownFence() {
		floorTable = "torture.fence_floor"
	}
	rows, err := reads.Query(ctx, `SELECT 'floor', '', max_token, '' FROM `+floorTable+` WHERE scope = $1
UNION ALL SELECT 'run', part, token, content FROM torture.run WHERE scope = $1
UNION ALL SELECT 'line', part, token, content FROM torture.line WHERE scope = $1`, scope)
	if err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	for rows.Next() {
		var kind, part, content string
		var token int64
		if err := rows.Scan(&kind, &part, &token, &content); err != nil {
			rows.Close()
			return Snapshot{}, err
		}
		if kind == "floor" {
			snap.Floor = uint64(token)
			continue
		}
		p := partIndex(part)
		if p < 0 {
			rows.Close()
			return Snapshot{}, fmt.Errorf("torture.%s holds part %q, which no write makes", kind, part)
		}
		t := 0
		if kind == tableNames[1] {
			t = 1
		}
		snap.Tables[t][p] = Cell{Token: uint64(token), Content: content}
	}
	return snap, rows.Err()
}

func (s *pgServer) close() error {
	if s.reads != nil {
		s.reads.Close()
	}
	return s.cluster.Stop()
}

// The holder's side.

func openPGHolder(ctx context.Context, spec holderSpec) (*holderBackend, error) {
	// pgxpool connects lazily: a holder started while the server is down
	// still starts, and campaigns once it is back.
	leasePool, err := pgxpool.New(ctx, spec.LeaseDSN)
	if err != nil {
		return nil, err
	}
	resPool, err := pgxpool.New(ctx, spec.ResourceDSN)
	if err != nil {
		leasePool.Close()
		return nil, err
	}
	be := &holderBackend{close: func() { resPool.Close(); leasePool.Close() }}
	if spec.Flavor == flavorNaive {
		be.lease = &naiveLease{pool: leasePool}
	} else if be.lease, err = fencepg.NewLeaseStore(leasePool); err != nil {
		be.close()
		return nil, err
	}
	switch spec.Flavor {
	case flavorFenced:
		// The idle timeout ends the transaction of a holder frozen inside
		// it after two TTLs, and with it the row locks it holds on the user
		// tables, which a newer holder's write of the same parts waits for
		// (the default is 5 s, longer than any history here). The fence
		// itself holds no lock while the caller's function runs.
		fence, err := fencepg.NewFence(resPool, fencepg.WithTimeouts(0, 2*spec.TTL))
		if err != nil {
			be.close()
			return nil, err
		}
		be.data = &pgFenced{fence: fence}
	case flavorUnfenced:
		be.data = &pgUnfenced{pool: resPool}
	case flavorStrict:
		be.data = &sqlFence{pool: resPool, strict: true}
	case flavorNaive:
		be.data = &sqlFence{pool: resPool}
	case flavorCheckFirst:
		be.data = &checkFirstFence{sqlFence: sqlFence{pool: resPool}, idle: checkFirstIdle * spec.TTL}
	default:
		be.close()
		return nil, fmt.Errorf("pg: unknown flavor %q", spec.Flavor)
	}
	return be, nil
}

// upsertRows writes the parts of one write into one user table.
func upsertRows(table string) string {
	return `INSERT INTO torture.` + table + ` AS t (scope, part, token, content, writer)
SELECT $1::text, p, $3::bigint, $4::text, $5::text FROM unnest($2::text[]) AS p
ON CONFLICT (scope, part) DO UPDATE
  SET token = EXCLUDED.token, content = EXCLUDED.content, writer = EXCLUDED.writer`
}

// writeRows writes the parts into both user tables in tx. Between the two
// statements, inside the transaction and with the first table's rows
// locked, it reports that it is inside and does the in-transaction work:
// where the nemesis's in-transaction pauses strike.
func writeRows(ctx context.Context, tx pgx.Tx, c leasecore.Claim, parts []int, content string, probe *txProbe) error {
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = partName(p)
	}
	for i, table := range tableNames {
		if i > 0 {
			probe.inside()
			probe.work()
		}
		if _, err := tx.Exec(ctx, upsertRows(table), c.Scope, names, int64(c.Token), content, c.Writer); err != nil {
			return err
		}
	}
	probe.done()
	return nil
}

// pgFenced is the library: both tables written in fencepg.Fence.RunTx,
// the check and the rows in one transaction.
type pgFenced struct{ fence *fencepg.Fence }

func (f *pgFenced) Fenced() bool { return true }

func (f *pgFenced) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return f.fence.Advance(ctx, c)
}

func (f *pgFenced) Write(ctx context.Context, c leasecore.Claim, parts []int, content string, probe *txProbe) (leasecore.Result, error) {
	return f.fence.RunTx(ctx, c, func(tx pgx.Tx) error { return writeRows(ctx, tx, c, parts, content, probe) })
}

// pgUnfenced is the negative control: the same transaction without the
// check. Every write that commits is "accepted".
type pgUnfenced struct{ pool *pgxpool.Pool }

func (u *pgUnfenced) Fenced() bool { return false }

func (u *pgUnfenced) Advance(context.Context, leasecore.Claim) (leasecore.Result, error) {
	return leasecore.Result{}, errors.ErrUnsupported
}

func (u *pgUnfenced) Write(ctx context.Context, c leasecore.Claim, parts []int, content string, probe *txProbe) (leasecore.Result, error) {
	err := pgx.BeginFunc(ctx, u.pool, func(tx pgx.Tx) error { return writeRows(ctx, tx, c, parts, content, probe) })
	if err != nil {
		return leasecore.Result{}, err
	}
	return leasecore.Result{Accepted: true}, nil
}

// sqlFence is this package's own fence in SQL, for two negative controls:
// the conditional floor update of the lease-fencing article (SOURCES.md) in
// the transaction of the rows. With strict it compares < instead of <=
// (flavorStrict: a holder's own second write is refused). Without it, the
// check is correct, but nothing forces a durable commit (flavorNaive, on a
// cluster with synchronous_commit=off).
type sqlFence struct {
	pool   *pgxpool.Pool
	strict bool
}

func (f *sqlFence) Fenced() bool { return true }

// queryRower runs check's statements: a transaction, or the pool
// (autocommit).
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// check raises the floor to c.Token if the floor allows it; a conflicting
// row that the WHERE refuses is still locked by ON CONFLICT, so the floor
// read next in the same transaction is the one that refused it.
func (f *sqlFence) check(ctx context.Context, tx queryRower, c leasecore.Claim) (leasecore.Result, error) {
	cmp := "<="
	if f.strict {
		cmp = "<" // THE BUG of flavorStrict
	}
	var floor int64
	err := tx.QueryRow(ctx, `INSERT INTO torture.fence_floor AS f (scope, max_token) VALUES ($1, $2)
ON CONFLICT (scope) DO UPDATE SET max_token = EXCLUDED.max_token WHERE f.max_token `+cmp+` EXCLUDED.max_token
RETURNING max_token`, c.Scope, int64(c.Token)).Scan(&floor)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := tx.QueryRow(ctx, `SELECT max_token FROM torture.fence_floor WHERE scope = $1`, c.Scope).Scan(&floor); err != nil {
			return leasecore.Result{}, err
		}
		return leasecore.Result{Floor: leasecore.Token(floor)}, nil
	}
	if err != nil {
		return leasecore.Result{}, err
	}
	return leasecore.Result{Accepted: true, Floor: leasecore.Token(floor)}, nil
}

func (f *sqlFence) run(ctx context.Context, c leasecore.Claim, rows func(pgx.Tx) error) (res leasecore.Result, err error) {
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if res, err = f.check(ctx, tx, c); err != nil || !res.Accepted {
			return err
		}
		return rows(tx)
	})
	if err != nil {
		return leasecore.Result{}, err
	}
	return res, nil
}

func (f *sqlFence) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return f.run(ctx, c, func(pgx.Tx) error { return nil })
}

func (f *sqlFence) Write(ctx context.Context, c leasecore.Claim, parts []int, content string, probe *txProbe) (leasecore.Result, error) {
	return f.run(ctx, c, func(tx pgx.Tx) error { return writeRows(ctx, tx, c, parts, content, probe) })
}

// checkFirstFence is the fenced transaction as fencepg ran it before it
// decided at commit (negative control flavorCheckFirst), in this package's
// own SQL on torture.fence_floor: the comparison is the transaction's
// first statement, and the lock it takes on the floor row — shared when
// the floor equals the token, exclusive when it raises it — is held until
// COMMIT, under an idle-in-transaction timeout of checkFirstIdle TTLs. A
// holder frozen inside it makes a newer holder's Advance, whose update of
// the floor row needs that lock, wait until it wakes or the timeout ends
// its session.
type checkFirstFence struct {
	sqlFence
	idle time.Duration
}

// Advance is one statement in autocommit, as the library's is: it holds
// the floor row's lock only while it runs.
func (f *checkFirstFence) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return f.check(ctx, f.pool, c)
}

func (f *checkFirstFence) Write(ctx context.Context, c leasecore.Claim, parts []int, content string, probe *txProbe) (res leasecore.Result, err error) {
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`,
			strconv.FormatInt(f.idle.Milliseconds(), 10)); err != nil {
			return err
		}
		// THE FLAW of flavorCheckFirst: the floor row locked from the first
		// statement to COMMIT.
		var floor int64
		err := tx.QueryRow(ctx, `SELECT max_token FROM torture.fence_floor WHERE scope = $1 FOR SHARE`, c.Scope).Scan(&floor)
		switch {
		case errors.Is(err, pgx.ErrNoRows) || (err == nil && floor < int64(c.Token)):
			// No Advance yet: the full check raises the floor, and holds
			// its exclusive lock to COMMIT.
			if res, err = f.check(ctx, tx, c); err != nil || !res.Accepted {
				return err
			}
		case err != nil:
			return err
		case floor > int64(c.Token):
			res = leasecore.Result{Floor: leasecore.Token(floor)}
			return nil
		default:
			res = leasecore.Result{Accepted: true, Floor: c.Token}
		}
		return writeRows(ctx, tx, c, parts, content, probe)
	})
	if err != nil {
		return leasecore.Result{}, err
	}
	return res, nil
}

// naiveLease is the lease of the lease-fencing article (SOURCES.md), one
// autocommit statement per operation, WITHOUT the library's forced durable
// commit: on a cluster with synchronous_commit=off an acquire is
// acknowledged before its WAL is written, and an immediate stop can take
// the token back. Negative control only.
type naiveLease struct{ pool *pgxpool.Pool }

var _ leasecore.Lease = (*naiveLease)(nil)

func (l *naiveLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, time.Millisecond); err != nil {
		return leasecore.Grant{}, err
	}
	start := time.Now()
	var token int64
	err := l.pool.QueryRow(ctx, `INSERT INTO torture.lease AS l (name, holder, token, expires_at)
VALUES ($1, $2, 1, now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, token = l.token + 1, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now()
RETURNING l.token`, name, holder, ttl.Microseconds()).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return leasecore.Grant{}, fmt.Errorf("naive lease: acquire %q: %w", name, leasecore.ErrHeld)
	}
	if err != nil {
		return leasecore.Grant{}, naiveUnavailable("acquire", err)
	}
	return leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(token), TTL: ttl, Start: start}, nil
}

func (l *naiveLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	start := time.Now()
	tag, err := l.pool.Exec(ctx, `UPDATE torture.lease SET expires_at = now() + $4::bigint * interval '1 microsecond'
WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now()`, g.Name, g.Holder, int64(g.Token), g.TTL.Microseconds())
	if err != nil {
		return leasecore.Grant{}, naiveUnavailable("renew", err)
	}
	if tag.RowsAffected() == 0 {
		return leasecore.Grant{}, fmt.Errorf("naive lease: renew %q token %d: %w", g.Name, g.Token, leasecore.ErrLost)
	}
	g.Start = start
	return g, nil
}

func (l *naiveLease) Release(ctx context.Context, g leasecore.Grant) error {
	tag, err := l.pool.Exec(ctx, `UPDATE torture.lease SET expires_at = '-infinity'
WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now()`, g.Name, g.Holder, int64(g.Token))
	if err != nil {
		return naiveUnavailable("release", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("naive lease: release %q token %d: %w", g.Name, g.Token, leasecore.ErrLost)
	}
	return nil
}

// naiveUnavailable marks an error as one that may pass, so that Campaign
// and the session retry it.
func naiveUnavailable(op string, err error) error {
	return fmt.Errorf("naive lease: %s: %w: %w", op, leasecore.ErrUnavailable, err)
}
