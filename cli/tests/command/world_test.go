package command_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/cli/internal/command"
	"github.com/leasefence/leasefence/cli/tests/internal/clitest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// result, run and want are the helpers of the server-free tests in
// cli/internal/command (run_test.go): a _test.go file cannot be shared
// across modules.

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// run runs the command in-process with an empty environment (the backend
// comes from flags) and the host name "testhost".
func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := command.Run(context.Background(), args, command.Env{
		Stdout: &out, Stderr: &errOut,
		Getenv:   func(string) string { return "" },
		Hostname: func() (string, error) { return "testhost", nil },
	})
	return result{code, out.String(), errOut.String()}
}

// want fails unless r exited with code and its stdout (and stderr) hold
// every one of wants.
func want(t *testing.T, r result, code int, wants ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	for _, w := range wants {
		if !strings.Contains(r.stdout+r.stderr, w) {
			t.Errorf("output lacks %q:\n%s", w, r)
		}
	}
}

// decode parses r's stdout as one JSON document into v.
func decode(t *testing.T, r result, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not the expected JSON: %v\n%s", err, r)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document:\n%s", r)
	}
}

// lease is what the tests need of a lease store.
type lease interface {
	leasecore.Lease
	leasecore.LeaseInspector
}

// world is a fresh lease service and fence on one backend, the flags
// that point the command at them, and the application's side: its lease
// store and a real fenced write.
type world struct {
	backend string
	flags   []string
	leases  lease
	ttl     time.Duration // a TTL the backend takes, for holders that stay
	// write is an application's fenced write of its own data under c:
	// PostgreSQL, a row in its own table in a transaction of Fence.RunTx;
	// etcd, a key of its own in a Txn of Fence.Commit.
	write func(ctx context.Context, c leasecore.Claim) (leasecore.Result, error)
	// rows lists what the application's writes stored, as text.
	rows func(t *testing.T) string
	// snapshot is every lease, floor and attempt-log entry as text, for
	// "nothing written" checks.
	snapshot func(t *testing.T) string
	// expire makes g's holding period end without a release, as a frozen
	// holder's does, and returns when a new acquire can succeed.
	expire func(t *testing.T, g leasecore.Grant)
	// shortTTL is the TTL for a holder that is to expire.
	shortTTL time.Duration
}

// run runs the command with the world's connection flags after args.
func (w *world) run(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, append(args, w.flags...)...)
}

func (w *world) acquire(t *testing.T, name, holder string, ttl time.Duration) leasecore.Grant {
	t.Helper()
	g, err := w.leases.Acquire(context.Background(), name, holder, ttl)
	if err != nil {
		t.Fatalf("acquire %s as %s: %v", name, holder, err)
	}
	return g
}

func (w *world) mustWrite(t *testing.T, c leasecore.Claim, accepted bool) leasecore.Result {
	t.Helper()
	res, err := w.write(context.Background(), c)
	if err != nil || res.Accepted != accepted {
		t.Fatalf("fenced write %+v: %+v, %v; want accepted=%t", c, res, err, accepted)
	}
	return res
}

// forEachBackend runs f on a fresh PostgreSQL world and a fresh etcd world.
func forEachBackend(t *testing.T, f func(t *testing.T, w *world)) {
	t.Run("postgres", func(t *testing.T) { f(t, newPGWorld(t)) })
	t.Run("etcd", func(t *testing.T) { f(t, newEtcdWorld(t)) })
}

// newPGWorld makes a lease database and a resource database, migrated by
// the command itself.
func newPGWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	leaseDSN, resDSN := clitest.CreateDB(t, "lease"), clitest.CreateDB(t, "res")
	w := &world{backend: "postgres", flags: []string{"--lease-dsn", leaseDSN, "--resource-dsn", resDSN},
		ttl: time.Minute, shortTTL: 100 * time.Millisecond}
	want(t, w.run(t, "migrate"), 0, "lease table: leasefence.lease ready", "fence tables")

	leasePool, resPool := openPool(t, leaseDSN), openPool(t, resDSN)
	leases, err := fencepg.NewLeaseStore(leasePool)
	if err != nil {
		t.Fatal(err)
	}
	fence, err := fencepg.NewFence(resPool)
	if err != nil {
		t.Fatal(err)
	}
	w.leases = leases
	if _, err := resPool.Exec(ctx, `CREATE TABLE invoice (writer text, token bigint)`); err != nil {
		t.Fatal(err)
	}
	w.write = func(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
		return fence.RunTx(ctx, c, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoice VALUES ($1, $2)`, c.Writer, int64(c.Token))
			return err
		})
	}
	w.rows = func(t *testing.T) string {
		return queryText(t, resPool, `SELECT coalesce(string_agg(writer || ':' || token, ' ' ORDER BY token, writer), '') FROM invoice`)
	}
	w.snapshot = func(t *testing.T) string {
		return queryText(t, leasePool, `SELECT coalesce(string_agg(l::text, E'\n' ORDER BY name), '') FROM leasefence.lease l`) + "\n" +
			queryText(t, resPool, `SELECT coalesce(string_agg(f::text, E'\n' ORDER BY scope), '') FROM leasefence.fence_floor f`) + "\n" +
			queryText(t, resPool, `SELECT coalesce(string_agg(a::text, E'\n' ORDER BY id), '') FROM leasefence.write_attempt a`)
	}
	w.expire = func(t *testing.T, g leasecore.Grant) {
		time.Sleep(g.TTL + 50*time.Millisecond)
	}
	return w
}

func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func queryText(t *testing.T, p *pgxpool.Pool, q string) string {
	t.Helper()
	var s string
	if err := p.QueryRow(context.Background(), q).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s
}

// newEtcdWorld makes a fresh key prefix on the shared etcd server.
func newEtcdWorld(t *testing.T) *world {
	t.Helper()
	endpoints := clitest.Etcd(t).Endpoints()
	prefix := clitest.NewPrefix()
	w := &world{backend: "etcd", flags: []string{"--endpoints", strings.Join(endpoints, ","), "--prefix", prefix},
		ttl: time.Minute, shortTTL: time.Second}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	leases, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leases.Close() })
	fence, err := fenceetcd.NewFence(cli, fenceetcd.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	w.leases = leases
	own := prefix + "/own/"
	w.write = func(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
		key := fmt.Sprintf("%s%s-%d", own, c.Writer, c.Token)
		res, _, err := fence.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(key, "invoice")}})
		return res, err
	}
	w.rows = func(t *testing.T) string {
		resp, err := cli.Get(context.Background(), own, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, kv := range resp.Kvs {
			out = append(out, strings.TrimPrefix(string(kv.Key), own))
		}
		return strings.Join(out, " ")
	}
	w.snapshot = func(t *testing.T) string {
		resp, err := cli.Get(context.Background(), prefix+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, kv := range resp.Kvs {
			fmt.Fprintf(&b, "%s=%s create=%d mod=%d\n", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision)
		}
		return b.String()
	}
	w.expire = func(t *testing.T, g leasecore.Grant) {
		// The lessor revokes an expired lease within about half a second
		// after its TTL (raised to the server's minimum): poll.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			st, err := leases.Inspect(context.Background(), g.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Exists || st.Token != g.Token {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("lease %s (token %d) did not expire within 10s", g.Name, g.Token)
	}
	return w
}
