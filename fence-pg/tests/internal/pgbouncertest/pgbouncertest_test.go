//go:build unix

package pgbouncertest_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgbouncertest"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
)

// TestMain stops the test binary's cluster and fails on a goroutine left
// behind (the reaper of a pgbouncer never stopped).
func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStartStop: a pooler in transaction mode on 127.0.0.1 only, in front
// of the cluster; two clients share one server connection (transaction
// pooling, not session pooling); Stop ends the process, frees the port and
// removes the files.
func TestStartStop(t *testing.T) {
	cluster := pgtest.Cluster(t)
	ctx := t.Context()
	b, err := pgbouncertest.Start(ctx, cluster, pgbouncertest.WithPoolSize(1), pgbouncertest.WithLog(testWriter{t}))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = b.Stop()
		}
	}()
	if !strings.HasPrefix(b.Version(), "PgBouncer ") {
		t.Errorf("version %q", b.Version())
	}
	conf := map[string]string{}
	rows, err := b.Admin(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		conf[r[0]] = r[1]
	}
	for k, want := range map[string]string{
		"pool_mode": "transaction", "listen_addr": "127.0.0.1", "listen_port": strconv.Itoa(b.Port()),
		"unix_socket_dir": "", "auth_type": "trust", "default_pool_size": "1",
	} {
		if conf[k] != want {
			t.Errorf("SHOW CONFIG %s = %q, want %q", k, conf[k], want)
		}
	}
	if !strings.HasPrefix(b.DSN("x"), "postgres://postgres@127.0.0.1:"+strconv.Itoa(b.Port())+"/x?sslmode=disable") {
		t.Errorf("DSN %q", b.DSN("x"))
	}

	// Two clients, one server connection: each statement borrows it for its
	// transaction only, so both see the same backend.
	db := "bouncer_" + strconv.Itoa(os.Getpid())
	if err := cluster.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	var pids []string
	for range 2 {
		c, err := pgconn.Connect(ctx, b.DSN(db))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		res, err := c.Exec(ctx, "SELECT pg_backend_pid(), current_database(), inet_server_addr()").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		row := res[0].Rows[0]
		if string(row[1]) != db || string(row[2]) != "127.0.0.1" {
			t.Errorf("through the pooler: database %s, server address %s", row[1], row[2])
		}
		pids = append(pids, string(row[0]))
	}
	if pids[0] != pids[1] {
		t.Errorf("two clients of a transaction pooler with one server connection got backends %v", pids)
	}

	// A session-level prepared statement stays on the server connection:
	// the next client that gets it collides with the name (SQLSTATE 42P05),
	// which is why pgx's default exec mode fails behind this pooler.
	c1, err := pgconn.Connect(ctx, b.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close(context.Background())
	c2, err := pgconn.Connect(ctx, b.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(context.Background())
	if _, err := c1.Prepare(ctx, "stmt_x", "SELECT 1", nil); err != nil {
		t.Fatal(err)
	}
	_, err = c2.Prepare(ctx, "stmt_x", "SELECT 2", nil)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P05" {
		t.Errorf("the second client's prepare of the same name: %v, want SQLSTATE 42P05", err)
	}

	pid := bouncerPID(t, b)
	c1.Close(ctx)
	c2.Close(ctx)
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := b.Stop(); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pgbouncer pid %d after Stop: kill -0 says %v", pid, err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.Port()), time.Second); err == nil {
		c.Close()
		t.Errorf("port %d still accepts after Stop", b.Port())
	}
	if _, err := os.Stat(b.LogPath()); !os.IsNotExist(err) {
		t.Errorf("files left after Stop: %s: %v", b.LogPath(), err)
	}
}

// bouncerPID reads pgbouncer's pid from the process listening on its port
// (its console does not report it): the one /proc entry whose command line
// names the config file next to the log.
func bouncerPID(t *testing.T, b *pgbouncertest.Bouncer) int {
	t.Helper()
	ini := strings.TrimSuffix(b.LogPath(), "pgbouncer.log") + "pgbouncer.ini"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc: cannot find the process")
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmdline), ini) {
			return pid
		}
	}
	t.Fatalf("no process runs with %s", ini)
	return 0
}

func TestNoBinary(t *testing.T) {
	t.Setenv(pgbouncertest.EnvBinary, "/nonexistent/pgbouncer")
	_, err := pgbouncertest.Start(t.Context(), pgtest.Cluster(t))
	if !errors.Is(err, pgbouncertest.ErrNoBinary) || !strings.Contains(err.Error(), "/nonexistent/pgbouncer") {
		t.Fatalf("Start with %s=/nonexistent/pgbouncer: %v", pgbouncertest.EnvBinary, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
