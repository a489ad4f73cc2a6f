package pgtemp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// These tests run real PostgreSQL binaries; a machine without them fails (see ErrNoBinaries for
// what to install) rather than skipping.

// localOnly makes the test use the local provider even when LEASEFENCE_PG_URL or
// LEASEFENCE_PG_DOCKER is set.
func localOnly(t *testing.T) {
	t.Setenv(envURL, "")
	t.Setenv(envDocker, "")
}

// testLog forwards progress lines to the test log, which is where the timings appear.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// funcWriter calls fn with each progress line, so a test can act at a precise point of Start.
type funcWriter func(line string)

func (f funcWriter) Write(p []byte) (int, error) {
	f(string(p))
	return len(p), nil
}

// reachableTempDir returns an empty directory to use as TMPDIR that the OS user postgres can
// enter: t.TempDir is 0700, and as root the server runs as postgres.
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != filepath.Dir(d); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// assertNothingLeft checks that a failed or stopped start left no files in tmpDir and no process
// whose command line mentions it.
func assertNothingLeft(t *testing.T, tmpDir string) {
	t.Helper()
	entries, err := os.ReadDir(tmpDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
	if pids := processesMentioning(t, tmpDir); len(pids) > 0 {
		t.Errorf("processes still running with %s in their command line: %v", tmpDir, pids)
	}
}

func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil || len(cmdlines) == 0 {
		t.Log("no /proc: not checking for leftover processes")
		return nil
	}
	var pids []string
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, filepath.Base(filepath.Dir(f))+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return pids
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { closeConn(conn) })
	return conn
}

func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(t.Context(), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}

func TestRestartImmediateKeepsCommittedRow(t *testing.T) {
	localOnly(t)
	ctx := t.Context()
	t0 := time.Now()
	c := StartTB(t, WithLog(testLog{t}))
	t.Logf("start took %v; PostgreSQL %s on %s:%d", time.Since(t0).Round(time.Millisecond), c.Version(), c.Host(), c.Port())
	if c.External() || c.DataDir() == "" || c.Host() != "127.0.0.1" || c.Version() == "" {
		t.Fatalf("External()=%v DataDir()=%q Host()=%q Version()=%q; want a local cluster on 127.0.0.1 with a version",
			c.External(), c.DataDir(), c.Host(), c.Version())
	}
	wantDSN := "postgres://postgres@127.0.0.1:" + strconv.Itoa(c.Port()) + "/res26?sslmode=disable"
	if got := c.DSN("res26"); got != wantDSN {
		t.Errorf("DSN(res26) = %q, want %q", got, wantDSN)
	}

	if err := c.CreateDatabase(ctx, "res26"); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, c.DSN("res26"))
	for _, setting := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		if got := show(t, conn, setting); got != "on" {
			t.Errorf("SHOW %s = %q, want on: durability must stay on for the crash test", setting, got)
		}
	}
	for _, sql := range []string{
		"CREATE TABLE fence_floor (scope text PRIMARY KEY, token bigint NOT NULL)",
		"SET synchronous_commit = on",
		"INSERT INTO fence_floor VALUES ('report', 7)",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	closeConn(conn)

	port := c.Port()
	downtime, err := c.RestartImmediate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restart downtime %v", downtime)
	if downtime <= 0 {
		t.Errorf("downtime = %v, want > 0", downtime)
	}
	if c.Port() != port {
		t.Errorf("port changed across restart: %d -> %d", port, c.Port())
	}

	conn = connect(t, c.DSN("res26"))
	var token int64
	if err := conn.QueryRow(ctx, "SELECT token FROM fence_floor WHERE scope = 'report'").Scan(&token); err != nil {
		t.Fatalf("committed row lost in the immediate restart: %v", err)
	}
	if token != 7 {
		t.Errorf("token = %d after restart, want 7", token)
	}
	for _, setting := range []string{"fsync", "synchronous_commit"} {
		if got := show(t, conn, setting); got != "on" {
			t.Errorf("after restart SHOW %s = %q, want on", setting, got)
		}
	}

	// The restart must have been a crash, not a clean shutdown: the server says it recovered.
	log, err := os.ReadFile(filepath.Join(filepath.Dir(c.DataDir()), "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("automatic recovery in progress")) {
		t.Errorf("server log has no \"automatic recovery in progress\": the restart was not an immediate shutdown\n%s", log)
	}
}

func TestCreateDatabaseRecreates(t *testing.T) {
	localOnly(t)
	ctx := t.Context()
	c := StartTB(t, WithLog(testLog{t}))

	// A name that needs quoting, both in SQL and in the DSN.
	for _, name := range []string{"lease26", `we"ird db`} {
		if err := c.CreateDatabase(ctx, name); err != nil {
			t.Fatal(err)
		}
		conn := connect(t, c.DSN(name))
		if _, err := conn.Exec(ctx, "CREATE TABLE leftover (id int)"); err != nil {
			t.Fatal(err)
		}
		// conn stays open: the recreate must end it rather than fail.
		if err := c.CreateDatabase(ctx, name); err != nil {
			t.Fatalf("second CreateDatabase(%q) with a session open: %v", name, err)
		}
		conn2 := connect(t, c.DSN(name))
		var found *string
		if err := conn2.QueryRow(ctx, "SELECT to_regclass('leftover')::text").Scan(&found); err != nil {
			t.Fatal(err)
		}
		if found != nil {
			t.Errorf("database %q: table leftover survived CreateDatabase, want a fresh database", name)
		}
	}
}

func TestWithPortInUse(t *testing.T) {
	localOnly(t)
	tmp := reachableTempDir(t)
	t.Setenv("TMPDIR", tmp)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	c, err := Start(t.Context(), WithPort(port))
	if err == nil {
		c.Stop()
		t.Fatalf("Start(WithPort(%d)) on an occupied port succeeded", port)
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, ErrPortInUse) {
		t.Errorf("err = %v, want errors.Is ErrPortInUse", err)
	}
	want := "port " + strconv.Itoa(port) + " on 127.0.0.1 is already in use"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("err = %q, want it to contain %q", err, want)
	}
	assertNothingLeft(t, tmp)
}

// TestPortTakenBeforeBind covers the race WithPort's check cannot: the port is free when checked
// but taken when postgres binds it, by any program or by another PostgreSQL (which might answer
// the readiness probe before ours gives up). Both must be reported as ErrPortInUse.
func TestPortTakenBeforeBind(t *testing.T) {
	localOnly(t)
	c := StartTB(t, WithLog(testLog{t}))
	other := StartTB(t)
	s := c.local
	c.mu.Lock()
	defer c.mu.Unlock()
	s.proc.stop(syscall.SIGINT, 10*time.Second)
	s.proc = nil

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for name, port := range map[string]int{"listener": ln.Addr().(*net.TCPAddr).Port, "other cluster": other.Port()} {
		s.port = port
		t1 := time.Now()
		_, _, err = s.startAndWait(t.Context())
		t.Logf("%s: failed start took %v; error: %v", name, time.Since(t1).Round(time.Millisecond), err)
		if !errors.Is(err, ErrPortInUse) {
			t.Fatalf("%s: err = %v, want errors.Is ErrPortInUse", name, err)
		}
		if !strings.Contains(err.Error(), "port "+strconv.Itoa(port)) {
			t.Errorf("%s: err = %q, want it to name port %d", name, err, port)
		}
		if s.proc != nil {
			t.Errorf("%s: a postmaster is recorded as running after a failed start", name)
		}
	}
	if conn := connect(t, other.DSN("postgres")); conn.Ping(t.Context()) != nil {
		t.Error("the other cluster was disturbed")
	}
}

func TestNoBinaries(t *testing.T) {
	localOnly(t)
	dir := t.TempDir()
	c, err := Start(t.Context(), WithBinDir(dir))
	if err == nil {
		c.Stop()
		t.Fatal("Start(WithBinDir(empty dir)) succeeded")
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, ErrNoBinaries) {
		t.Errorf("err = %v, want errors.Is ErrNoBinaries", err)
	}
	for _, want := range []string{dir, "apt-get install -y postgresql", "LEASEFENCE_PG_BINDIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q\nwant it to contain %q", err, want)
		}
	}
}

func TestEnvBinDirIsAuthoritative(t *testing.T) {
	localOnly(t)
	t.Setenv(envBinDir, t.TempDir())
	_, err := Start(t.Context())
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("err = %v, want ErrNoBinaries: an explicit %s must not fall back to another installation", err, envBinDir)
	}
}

func TestVersionedDirsNewestFirst(t *testing.T) {
	root := t.TempDir()
	prefix := root + "/pg/"
	for _, v := range []string{"9.6", "10", "16", "15", "beta"} {
		dir := filepath.Join(root, "pg", v, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		progs := []string{"initdb", "postgres"}
		if v == "16" {
			progs = progs[:1] // a client-only or half-removed installation
		}
		for _, p := range progs {
			if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	var got []string
	for _, d := range versionedDirs(prefix, "/bin") {
		got = append(got, strings.TrimSuffix(strings.TrimPrefix(d, prefix), "/bin"))
	}
	if want := "16 15 10 9.6 beta"; strings.Join(got, " ") != want {
		t.Errorf("versionedDirs order = %v, want %s", got, want)
	}
	if b, why := binDir(filepath.Join(root, "pg", "16", "bin")); why != "no postgres" {
		t.Errorf("binDir(16 without postgres) = %+v, %q; want \"no postgres\"", b, why)
	}
}

func TestStopIsIdempotent(t *testing.T) {
	localOnly(t)
	before := runtime.NumGoroutine()
	c, err := Start(t.Context(), WithLog(testLog{t}))
	if err != nil {
		t.Fatal(err)
	}
	port, tmp := c.Port(), filepath.Dir(c.DataDir())

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = c.Stop() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Stop #%d: %v", i, err)
		}
	}
	if err := c.Stop(); err != nil {
		t.Errorf("Stop after Stop: %v", err)
	}

	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second); err == nil {
		conn.Close()
		t.Errorf("port %d still accepts connections after Stop", port)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s after Stop: %v, want it gone", tmp, err)
	}
	if pids := processesMentioning(t, tmp); len(pids) > 0 {
		t.Errorf("processes left after Stop: %v", pids)
	}
	if _, err := c.RestartImmediate(t.Context()); err == nil {
		t.Error("RestartImmediate after Stop succeeded")
	}
	if err := c.CreateDatabase(t.Context(), "late"); err == nil {
		t.Error("CreateDatabase after Stop succeeded")
	}

	// No goroutine of ours may outlive Stop; allow a moment for exiting ones to finish.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after Stop, %d before Start:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

func TestStartCancelled(t *testing.T) {
	localOnly(t)
	for _, tc := range []struct {
		name string
		// cancelAt is the progress line at which the context is cancelled ("" = before Start);
		// delay lets the step begin before the cancel lands.
		cancelAt string
		delay    time.Duration
	}{
		{name: "before start"},
		{name: "during initdb", cancelAt: "pgtemp: initdb ", delay: 300 * time.Millisecond},
		{name: "waiting for postgres", cancelAt: "pgtemp: starting postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := reachableTempDir(t)
			t.Setenv("TMPDIR", tmp)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.cancelAt == "" {
				cancel()
			}
			log := funcWriter(func(line string) {
				t.Log(strings.TrimSpace(line))
				if tc.cancelAt != "" && strings.HasPrefix(line, tc.cancelAt) {
					time.AfterFunc(tc.delay, cancel)
				}
			})
			c, err := Start(ctx, WithLog(log))
			if err == nil {
				c.Stop()
				t.Fatal("Start with a cancelled context succeeded")
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want errors.Is context.Canceled", err)
			}
			assertNothingLeft(t, tmp)
		})
	}
}

func TestTempDirNotReachable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only as root does the server run as another user who may not reach TMPDIR")
	}
	localOnly(t)
	tmp := t.TempDir() // 0700, root's
	t.Setenv("TMPDIR", tmp)
	_, err := Start(t.Context())
	t.Logf("error: %v", err)
	if err == nil || !strings.Contains(err.Error(), "TMPDIR") {
		t.Fatalf("err = %v, want an error telling to set TMPDIR", err)
	}
	assertNothingLeft(t, tmp)
}

// TestExternal points LEASEFENCE_PG_URL at a local cluster, which is as real an external server
// as any.
func TestExternal(t *testing.T) {
	localOnly(t)
	ctx := t.Context()
	base := StartTB(t, WithLog(testLog{t}))
	t.Setenv(envURL, base.DSN("postgres"))

	c, err := Start(ctx, WithLog(testLog{t}), WithPort(1)) // WithPort is ignored
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if !c.External() || c.DataDir() != "" || c.Port() != base.Port() || c.Host() != "127.0.0.1" || c.Version() != base.Version() {
		t.Errorf("External()=%v DataDir()=%q Port()=%d Host()=%q Version()=%q; want the external server on port %d",
			c.External(), c.DataDir(), c.Port(), c.Host(), c.Version(), base.Port())
	}
	if got, want := c.DSN("lease26"), base.DSN("lease26"); got != want {
		t.Errorf("DSN(lease26) = %q, want %q", got, want)
	}

	if err := c.CreateDatabase(ctx, "ext26"); err != nil {
		t.Fatal(err)
	}
	connect(t, c.DSN("ext26"))

	_, err = c.RestartImmediate(ctx)
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "external server (LEASEFENCE_PG_URL): cannot crash it") {
		t.Errorf("RestartImmediate on an external server: %v; want ErrNotSupported saying it cannot crash it", err)
	}

	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	var exists bool
	conn := connect(t, base.DSN("postgres"))
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'ext26')").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Error("database ext26 still exists after Stop of the external cluster that created it")
	}
	if _, err := base.RestartImmediate(ctx); err != nil {
		t.Errorf("the external server's Stop disturbed it: %v", err)
	}
}

// TestNoOrphanWhenParentKilled kills a process that started a cluster with SIGKILL, so it
// cannot run Stop, and expects the server to go away anyway (the parent-death signal).
func TestNoOrphanWhenParentKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal exists only on Linux")
	}
	localOnly(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartAndHang$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEMP_TEST_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dataDir, port string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "READY %s %s", &dataDir, &port); err == nil {
			break
		}
	}
	if dataDir == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("helper did not report a started cluster")
	}
	tmp := filepath.Dir(dataDir)
	t.Cleanup(func() { os.RemoveAll(tmp) }) // the killed helper could not remove it
	cmd.Process.Kill()
	cmd.Wait()

	deadline := time.Now().Add(15 * time.Second)
	for {
		pids := processesMentioning(t, dataDir)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server still running 15s after its parent was killed: %v", pids)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
		conn.Close()
		t.Errorf("port %s still accepts connections after the parent was killed", port)
	}
}

// TestHelperStartAndHang is not a test: TestNoOrphanWhenParentKilled runs it in a child process.
func TestHelperStartAndHang(t *testing.T) {
	if os.Getenv("PGTEMP_TEST_HELPER") != "1" {
		return
	}
	c, err := Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("READY %s %d\n", c.DataDir(), c.Port())
	select {}
}

// TestWithSetting: a parameter given with WithSetting overrides pgtemp's own and survives a
// restart; a bad name or the external provider is refused before anything starts.
func TestWithSetting(t *testing.T) {
	localOnly(t)
	ctx := t.Context()
	c := StartTB(t, WithLog(testLog{t}),
		WithSetting("default_transaction_isolation", "serializable"),
		WithSetting("synchronous_commit", "off"))
	show := func(name string) string {
		conn := connect(t, c.DSN("postgres"))
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	check := func(when string) {
		if got := show("default_transaction_isolation"); got != "serializable" {
			t.Errorf("%s: default_transaction_isolation = %q, want serializable", when, got)
		}
		if got := show("synchronous_commit"); got != "off" {
			t.Errorf("%s: synchronous_commit = %q, want off (WithSetting overrides pgtemp's on)", when, got)
		}
	}
	check("after start")
	if _, err := c.RestartImmediate(ctx); err != nil {
		t.Fatal(err)
	}
	check("after RestartImmediate")

	for _, opt := range []Option{WithSetting("", "x"), WithSetting("fsync=off -c x", "y"), WithPort(-1)} {
		c, err := Start(ctx, opt)
		if err == nil {
			c.Stop()
			t.Fatal("Start with a bad option succeeded")
		}
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("err = %v, want errors.Is ErrInvalidOption", err)
		}
	}
	t.Setenv(envURL, "postgres://postgres@127.0.0.1:1/postgres")
	if _, err := Start(ctx, WithSetting("fsync", "off")); !errors.Is(err, ErrNotSupported) {
		t.Errorf("external provider with WithSetting: err = %v, want errors.Is ErrNotSupported", err)
	}
}
