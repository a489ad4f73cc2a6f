package command

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// backend is what the subcommands need of a lease service and a fence:
// fence-pg's and fence-etcd's exported API behind one face.
type backend interface {
	kind() string
	// checkTTL validates break's --ttl for this backend, as a usage error.
	checkTTL(cmd string, ttl time.Duration) error
	// maxList is the largest --limit of list and floors.
	maxList() int

	list(ctx context.Context, limit int) ([]leasecore.LeaseState, error)
	inspect(ctx context.Context, name string) (leasecore.LeaseState, error)
	// tokenBound returns the largest token lease name can have issued, and
	// says what it is. known is false when nothing can be said (no lease of
	// that name on PostgreSQL, when the name was only guessed: explicit
	// false).
	tokenBound(ctx context.Context, name string, explicit bool) (bound leasecore.Token, desc string, known bool, err error)
	takeOver(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, leasecore.LeaseState, error)
	release(ctx context.Context, g leasecore.Grant) error

	floors(ctx context.Context, limit int) ([]leasecore.ScopeFloor, error)
	floor(ctx context.Context, scope string) (leasecore.Token, error)
	attempts(ctx context.Context, q leasecore.AttemptQuery, rejectedOnly bool) ([]leasecore.Attempt, error)
	advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error)
	prune(ctx context.Context, scope string, before time.Time) (int64, error)

	// migrate creates what the backend needs and says what it did.
	migrate(ctx context.Context) ([]string, error)
	close()
}

const (
	backendPostgres = "postgres"
	backendEtcd     = "etcd"
)

// pgEnv are the libpq variables that point at a server (pgx reads them,
// and more, when no DSN is given).
var pgEnv = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

// chooseBackend decides the backend: --backend, else the connection flags
// given, else the environment (PG*, ETCDCTL_ENDPOINTS). Flags of the other
// backend are a usage error: they would be silently ignored.
func (r *runner) chooseBackend(cmd string) (string, error) {
	o := &r.opts
	var pgFlags, etcdFlags []string
	for _, f := range []string{"dsn", "lease-dsn", "resource-dsn", "schema"} {
		if o.set[f] {
			pgFlags = append(pgFlags, "--"+f)
		}
	}
	for _, f := range append([]string{"endpoints", "prefix"}, etcdSecurityFlags...) {
		if o.set[f] {
			etcdFlags = append(etcdFlags, "--"+f)
		}
	}
	switch o.backend {
	case "postgres", "postgresql", "pg":
		if len(etcdFlags) > 0 {
			return "", usagef(cmd, "%s: etcd flags (%s) given, but --backend is %s", cmd, strings.Join(etcdFlags, ", "), o.backend)
		}
		return backendPostgres, nil
	case "etcd":
		if len(pgFlags) > 0 {
			return "", usagef(cmd, "%s: PostgreSQL flags (%s) given, but --backend is etcd", cmd, strings.Join(pgFlags, ", "))
		}
		return backendEtcd, nil
	case "":
	default:
		return "", usagef(cmd, "%s: --backend %q: must be postgres or etcd", cmd, o.backend)
	}
	switch {
	case len(pgFlags) > 0 && len(etcdFlags) > 0:
		return "", usagef(cmd, "%s: both PostgreSQL flags (%s) and etcd flags (%s) given: use one backend, or say which with --backend",
			cmd, strings.Join(pgFlags, ", "), strings.Join(etcdFlags, ", "))
	case len(pgFlags) > 0:
		return backendPostgres, nil
	case len(etcdFlags) > 0:
		return backendEtcd, nil
	}
	var pgSet []string
	for _, v := range pgEnv {
		if r.env.Getenv(v) != "" {
			pgSet = append(pgSet, v)
		}
	}
	etcdSet := r.env.Getenv("ETCDCTL_ENDPOINTS") != ""
	switch {
	case len(pgSet) > 0 && etcdSet:
		return "", usagef(cmd, "%s: both %s and ETCDCTL_ENDPOINTS are set: say which backend with --backend", cmd, strings.Join(pgSet, ", "))
	case len(pgSet) > 0:
		return backendPostgres, nil
	case etcdSet:
		return backendEtcd, nil
	}
	return "", usagef(cmd, "%s: no backend: give --backend, --dsn or --endpoints (or set PG* or ETCDCTL_ENDPOINTS)", cmd)
}

// openBackend makes the stores the command needs. Nothing connects yet,
// except an etcd client with a user, which logs in (within ctx): pgx pools
// and etcd clients connect on first use, so a bad flag is reported before
// any traffic.
func (r *runner) openBackend(ctx context.Context, cmd string) (backend, error) {
	kind, err := r.chooseBackend(cmd)
	if err != nil {
		return nil, err
	}
	if kind == backendEtcd {
		return r.openEtcd(ctx, cmd)
	}
	return r.openPostgres(cmd)
}

// --- PostgreSQL --------------------------------------------------------

type pgBackend struct {
	pools  []*pgxpool.Pool
	leases *fencepg.LeaseStore
	fence  *fencepg.Fence
	schema string
}

func (r *runner) openPostgres(cmd string) (backend, error) {
	o := &r.opts
	b := &pgBackend{schema: fencepg.DefaultSchema}
	var opts []fencepg.Option
	if o.set["schema"] {
		opts = append(opts, fencepg.WithSchema(o.schema))
		b.schema = o.schema
	}
	need := r.cmd.needs
	pools := map[string]*pgxpool.Pool{} // one pool when both DSNs are one
	pool := func(flagName, dsn string) (*pgxpool.Pool, error) {
		if p, ok := pools[dsn]; ok {
			return p, nil
		}
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			src := flagName
			if dsn == "" {
				src = "PG* environment"
			}
			b.close()
			return nil, usagef(cmd, "%s: %s: %v", cmd, src, err)
		}
		cfg.MaxConns = 4
		if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
			cfg.ConnConfig.RuntimeParams["application_name"] = "leasefence"
		}
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			b.close()
			return nil, fmt.Errorf("open pool: %w", err)
		}
		pools[dsn] = p
		b.pools = append(b.pools, p)
		return p, nil
	}
	if need == needLease || need == needBoth {
		flagName, dsn := dsnOf("--lease-dsn", o.leaseDSN, o.dsn)
		p, err := pool(flagName, dsn)
		if err != nil {
			return nil, err
		}
		if b.leases, err = fencepg.NewLeaseStore(p, opts...); err != nil {
			b.close()
			return nil, err
		}
	}
	if need == needFence || need == needBoth {
		flagName, dsn := dsnOf("--resource-dsn", o.resourceDSN, o.dsn)
		p, err := pool(flagName, dsn)
		if err != nil {
			return nil, err
		}
		// Every attempt logged: the operator's own advances (advance, break)
		// then appear in the scope's attempt log, accepted, under their
		// writer, next to the rejections they cause.
		if b.fence, err = fencepg.NewFence(p, append(opts, fencepg.WithAttemptLog(leasecore.LogAll))...); err != nil {
			b.close()
			return nil, err
		}
	}
	return b, nil
}

// dsnOf picks a store's DSN: its own flag, else --dsn, else "" (PG*).
func dsnOf(own, ownValue, common string) (flagName, dsn string) {
	switch {
	case ownValue != "":
		return own, ownValue
	case common != "":
		return "--dsn", common
	}
	return "", ""
}

func (b *pgBackend) kind() string { return backendPostgres }
func (b *pgBackend) maxList() int { return fencepg.MaxList }

func (b *pgBackend) checkTTL(cmd string, ttl time.Duration) error {
	if ttl < fencepg.MinTTL || ttl > backendkit.MaxTTL {
		return usagef(cmd, "%s: --ttl %v: must be %v to %v", cmd, ttl, fencepg.MinTTL, backendkit.MaxTTL)
	}
	return nil
}

func (b *pgBackend) list(ctx context.Context, limit int) ([]leasecore.LeaseState, error) {
	return b.leases.List(ctx, limit)
}

func (b *pgBackend) inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	return b.leases.Inspect(ctx, name)
}

func (b *pgBackend) tokenBound(ctx context.Context, name string, explicit bool) (leasecore.Token, string, bool, error) {
	st, err := b.leases.Inspect(ctx, name)
	switch {
	case err != nil:
		return 0, "", false, err
	case !st.Exists && !explicit:
		return 0, fmt.Sprintf("no lease named %q (name the scope's lease: SCOPE=LEASE)", name), false, nil
	case !st.Exists:
		return 0, fmt.Sprintf("lease %q has never issued a token", name), true, nil
	}
	return st.Token, fmt.Sprintf("lease %q has issued tokens up to %d", name, st.Token), true, nil
}

func (b *pgBackend) takeOver(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, leasecore.LeaseState, error) {
	return b.leases.TakeOver(ctx, name, holder, ttl)
}

func (b *pgBackend) release(ctx context.Context, g leasecore.Grant) error {
	return b.leases.Release(ctx, g)
}

func (b *pgBackend) floors(ctx context.Context, limit int) ([]leasecore.ScopeFloor, error) {
	return b.fence.Floors(ctx, limit)
}

func (b *pgBackend) floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return b.fence.Floor(ctx, scope)
}

func (b *pgBackend) attempts(ctx context.Context, q leasecore.AttemptQuery, rejectedOnly bool) ([]leasecore.Attempt, error) {
	if rejectedOnly {
		return b.fence.RejectedAttempts(ctx, q)
	}
	return b.fence.Attempts(ctx, q)
}

func (b *pgBackend) advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return b.fence.Advance(ctx, c)
}

func (b *pgBackend) prune(ctx context.Context, scope string, before time.Time) (int64, error) {
	return b.fence.PruneAttempts(ctx, scope, before)
}

func (b *pgBackend) migrate(ctx context.Context) ([]string, error) {
	if err := b.leases.Migrate(ctx); err != nil {
		return nil, err
	}
	done := []string{fmt.Sprintf("lease table: %s.lease ready", b.schema)}
	if err := b.fence.Migrate(ctx); err != nil {
		return done, err
	}
	return append(done, fmt.Sprintf("fence tables: %[1]s.fence_floor, %[1]s.write_attempt, %[1]s.report_part ready", b.schema)), nil
}

func (b *pgBackend) close() {
	for _, p := range b.pools {
		p.Close()
	}
	b.pools = nil
}

// --- etcd ---------------------------------------------------------------

type etcdBackend struct {
	cli       *clientv3.Client
	leases    *fenceetcd.LeaseStore
	fence     *fenceetcd.Fence
	endpoints []string
	access    etcdAccess
}

// defaultEndpoint is etcdctl's default.
const defaultEndpoint = "127.0.0.1:2379"

func (r *runner) openEtcd(ctx context.Context, cmd string) (backend, error) {
	o := &r.opts
	raw, src := o.endpoints, "--endpoints"
	if !o.set["endpoints"] {
		raw, src = r.env.Getenv("ETCDCTL_ENDPOINTS"), "ETCDCTL_ENDPOINTS"
	}
	if raw == "" {
		raw = defaultEndpoint
	}
	var endpoints []string
	for e := range strings.SplitSeq(raw, ",") {
		e = strings.TrimSpace(e)
		if e == "" || strings.ContainsAny(e, " \t") {
			return nil, usagef(cmd, "%s: %s %q: want a comma-separated list of host:port or URLs", cmd, src, raw)
		}
		endpoints = append(endpoints, e)
	}
	access, err := r.etcdAccess(cmd, endpoints)
	if err != nil {
		return nil, err
	}
	var opts []fenceetcd.Option
	if o.set["prefix"] {
		opts = append(opts, fenceetcd.WithPrefix(o.prefix))
	}
	// The options are checked before the client exists (NewFence checks
	// them and nothing else): a client with a user logs in as it is made.
	check := clientv3.NewCtxClient(ctx)
	_, err = fenceetcd.NewFence(check, opts...)
	_ = check.Close()
	if err != nil {
		return nil, err
	}
	// The client connects on first use, bounded by the command's context.
	// With a user it logs in now, for at most DialTimeout, the time left
	// of --timeout (not through Config.Context: the client would end with
	// the command's context, and break releases its lease after that).
	var login time.Duration
	if access.user != "" {
		login = time.Second
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) > login {
			login = time.Until(dl)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: access.tls,
		Username: access.user, Password: access.password, DialTimeout: login, Logger: zap.NewNop()})
	if err != nil {
		b := &etcdBackend{endpoints: endpoints, access: access}
		if access.user == "" {
			return nil, usagef(cmd, "%s: %s: %v", cmd, src, err)
		}
		return nil, b.explain(loginError(ctx, access.user, err))
	}
	b := &etcdBackend{cli: cli, endpoints: endpoints, access: access}
	if b.leases, err = fenceetcd.NewLeaseStore(cli, opts...); err != nil {
		b.close()
		return nil, err
	}
	// Every attempt logged, as on PostgreSQL: the operator's advances
	// appear in the attempt log.
	if b.fence, err = fenceetcd.NewFence(cli, append(opts, fenceetcd.WithAttemptLog(leasecore.LogAll))...); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *etcdBackend) kind() string { return backendEtcd }
func (b *etcdBackend) maxList() int { return fenceetcd.MaxList }

func (b *etcdBackend) checkTTL(cmd string, ttl time.Duration) error {
	if ttl < fenceetcd.MinTTL || ttl > backendkit.MaxTTL || ttl%time.Second != 0 {
		return usagef(cmd, "%s: --ttl %v: must be whole seconds, %v to %v (etcd lease TTLs are whole seconds)",
			cmd, ttl, fenceetcd.MinTTL, backendkit.MaxTTL)
	}
	return nil
}

func (b *etcdBackend) list(ctx context.Context, limit int) ([]leasecore.LeaseState, error) {
	return b.leases.List(ctx, limit)
}

func (b *etcdBackend) inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	return b.leases.Inspect(ctx, name)
}

// tokenBound: a held lease's token is the latest it issued (its key's
// mod revision; earlier holding periods had smaller ones). A free lease
// has no key, and etcd keeps no record of its tokens: the cluster's
// revision bounds every token the cluster ever issued.
func (b *etcdBackend) tokenBound(ctx context.Context, name string, _ bool) (leasecore.Token, string, bool, error) {
	st, err := b.leases.Inspect(ctx, name)
	if err != nil {
		return 0, "", false, err
	}
	if st.Exists {
		return st.Token, fmt.Sprintf("lease %q's current holding period has token %d, the latest it issued", name, st.Token), true, nil
	}
	rev, err := b.leases.TokenCeiling(ctx)
	if err != nil {
		return 0, "", false, err
	}
	return rev, fmt.Sprintf("this etcd cluster has issued no token above its revision %d", rev), true, nil
}

func (b *etcdBackend) takeOver(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, leasecore.LeaseState, error) {
	return b.leases.TakeOver(ctx, name, holder, ttl)
}

func (b *etcdBackend) release(ctx context.Context, g leasecore.Grant) error {
	return b.leases.Release(ctx, g)
}

func (b *etcdBackend) floors(ctx context.Context, limit int) ([]leasecore.ScopeFloor, error) {
	return b.fence.Floors(ctx, limit)
}

func (b *etcdBackend) floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return b.fence.Floor(ctx, scope)
}

func (b *etcdBackend) attempts(ctx context.Context, q leasecore.AttemptQuery, rejectedOnly bool) ([]leasecore.Attempt, error) {
	if rejectedOnly {
		return b.fence.RejectedAttempts(ctx, q)
	}
	return b.fence.Attempts(ctx, q)
}

func (b *etcdBackend) advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return b.fence.Advance(ctx, c)
}

func (b *etcdBackend) prune(ctx context.Context, scope string, before time.Time) (int64, error) {
	return b.fence.PruneAttempts(ctx, scope, before)
}

func (b *etcdBackend) migrate(context.Context) ([]string, error) {
	return []string{"etcd: nothing to migrate (keys are created on first use)"}, nil
}

func (b *etcdBackend) close() {
	if b.leases != nil {
		_ = b.leases.Close()
	}
	_ = b.cli.Close()
}
