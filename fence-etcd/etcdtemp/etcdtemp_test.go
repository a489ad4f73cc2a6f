package etcdtemp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// These tests start real etcd servers in child processes: this test binary, re-executed with
// ServeEnv set, which TestMain turns into a server.
func TestMain(m *testing.M) {
	if IsServeProcess() {
		os.Exit(Serve())
	}
	os.Exit(m.Run())
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

func newClient(t *testing.T, s *Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func put(t *testing.T, cli *clientv3.Client, key, val string, opts ...clientv3.OpOption) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, key, val, opts...)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

// pidGone reports whether no thread of the process with the pid is alive. A zombie counts as
// gone once all its threads have exited (its files, sockets included, are closed then): an
// orphan's zombie stays until PID 1 reaps it, which some container inits never do.
func pidGone(pid int) bool {
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/stat")
	if err != nil {
		return false
	}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // this thread has just exited
		}
		// "tid (comm) S ...": the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || b[i+2] != 'Z' {
			return false
		}
	}
	return true
}

func requireProc(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: cannot check processes")
	}
}

// serveProcessesUnder lists the live processes whose ServeEnv mentions dir: etcdtemp children
// of a server whose temp directory is under dir.
func serveProcessesUnder(t *testing.T, dir string) []string {
	t.Helper()
	environs, _ := filepath.Glob("/proc/[0-9]*/environ")
	var pids []string
	for _, f := range environs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(b, []byte{0}) {
			if bytes.HasPrefix(kv, []byte(ServeEnv+"=")) && bytes.Contains(kv, []byte(dir)) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
				if !pidGone(pid) {
					pids = append(pids, strconv.Itoa(pid))
				}
			}
		}
	}
	return pids
}

// assertNothingLeft checks that tmpDir (the TMPDIR of a Start) is empty and that no server
// process started with it runs.
func assertNothingLeft(t *testing.T, tmpDir string) {
	t.Helper()
	entries, err := os.ReadDir(tmpDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
	if pids := serveProcessesUnder(t, tmpDir); len(pids) > 0 {
		t.Errorf("etcdtemp children still running: pids %v", pids)
	}
}

func assertRefuses(t *testing.T, endpoint string) {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still accepts connections", u.Host)
	}
}

// clientGoroutines counts goroutines running etcdtemp, etcd client or gRPC code, besides the
// test's own.
func clientGoroutines() (int, string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var found []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "etcdtemp.Test") || strings.Contains(g, "testing.tRunner") {
			continue
		}
		if strings.Contains(g, "etcdtemp.") || strings.Contains(g, "go.etcd.io/") || strings.Contains(g, "google.golang.org/grpc") {
			n++
			found = append(found, g)
		}
	}
	return n, strings.Join(found, "\n\n")
}

func TestKillRestartKeepsData(t *testing.T) {
	requireProc(t)
	ctx := t.Context()
	t0 := time.Now()
	s := StartTB(t, WithLog(testLog{t}))
	t.Logf("start took %v: etcd %s on %v, pid %d", time.Since(t0).Round(time.Millisecond), s.Version(), s.Endpoints(), s.PID())

	if s.Version() != version.Version {
		t.Errorf("Version() = %q, want %q, the etcd built into this binary", s.Version(), version.Version)
	}
	endpoints := s.Endpoints()
	if len(endpoints) != 1 || !strings.HasPrefix(endpoints[0], "http://127.0.0.1:") {
		t.Fatalf("Endpoints() = %v, want one http://127.0.0.1:PORT", endpoints)
	}
	if fi, err := os.Stat(filepath.Join(s.DataDir(), "member", "wal")); err != nil || !fi.IsDir() {
		t.Errorf("no WAL directory in DataDir() %s: %v", s.DataDir(), err)
	}

	cli := newClient(t, s)
	firstRev := put(t, cli, "fence/floor", "7")
	resp, err := cli.Get(ctx, "fence/floor")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "7" {
		t.Fatalf("get fence/floor = %v, want 7", resp.Kvs)
	}

	maxRev := firstRev
	var downtimes []time.Duration
	for round := range 3 {
		// A burst of acknowledged writes right up to the kill: every one must survive.
		for i := range 100 {
			maxRev = max(maxRev, put(t, cli, fmt.Sprintf("burst/%d/%03d", round, i), "x"))
		}
		oldPID := s.PID()
		downtime, err := s.KillRestart(ctx)
		if err != nil {
			t.Fatal(err)
		}
		downtimes = append(downtimes, downtime)
		t.Logf("KillRestart %d: downtime %v, pid %d -> %d", round+1, downtime.Round(time.Millisecond), oldPID, s.PID())
		if downtime <= 0 {
			t.Errorf("downtime = %v, want > 0", downtime)
		}
		if !pidGone(oldPID) {
			t.Errorf("the killed child %d is still alive", oldPID)
		}
		if s.PID() == 0 || s.PID() == oldPID {
			t.Errorf("PID() = %d after restart, want a new child (was %d)", s.PID(), oldPID)
		}
		if got := s.Endpoints(); !slices.Equal(got, endpoints) {
			t.Errorf("Endpoints() changed across KillRestart: %v -> %v", endpoints, got)
		}

		// The client from before the kill reconnects by itself.
		resp, err := cli.Get(ctx, "fence/floor")
		if err != nil {
			t.Fatalf("get after restart: %v", err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "7" || resp.Kvs[0].ModRevision != firstRev {
			t.Fatalf("after restart fence/floor = %v, want value 7 at revision %d", resp.Kvs, firstRev)
		}
		burst, err := cli.Get(ctx, fmt.Sprintf("burst/%d/", round), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if burst.Count != 100 {
			t.Errorf("round %d: %d of 100 acknowledged writes survived the kill", round, burst.Count)
		}
		if burst.Header.Revision < maxRev {
			t.Errorf("store revision %d after restart, below the %d acknowledged before the kill", burst.Header.Revision, maxRev)
		}
		rev := put(t, cli, "after/"+strconv.Itoa(round), "y")
		if rev <= maxRev {
			t.Errorf("put after restart got revision %d, want > %d (every revision before the kill)", rev, maxRev)
		}
		maxRev = rev
	}
	t.Logf("KillRestart downtimes: %v", downtimes)

	// The server's own output says the restarts went through its startup path again.
	out, err := os.ReadFile(filepath.Join(filepath.Dir(s.DataDir()), "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(out, []byte(serveMarker+" pid ")); n != 4 {
		t.Errorf("etcd.log shows %d server starts, want 4 (one start, three restarts):\n%s", n, out)
	}
}

func TestStop(t *testing.T) {
	requireProc(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	before, _ := clientGoroutines()

	s, err := Start(t.Context(), WithLog(testLog{t}))
	if err != nil {
		t.Fatal(err)
	}
	pid, endpoint, dataDir := s.PID(), s.Endpoints()[0], s.DataDir()
	if !strings.HasPrefix(dataDir, tmp+string(filepath.Separator)) {
		t.Errorf("DataDir() = %s, want it under TMPDIR %s", dataDir, tmp)
	}
	cli := newClient(t, s)
	put(t, cli, "k", "v")
	cli.Close()

	// Concurrent and repeated Stops all succeed; only the first does the work.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Stop() })
	}
	wg.Wait()
	errs = append(errs, s.Stop())
	for i, err := range errs {
		if err != nil {
			t.Errorf("Stop call %d: %v", i+1, err)
		}
	}

	if !pidGone(pid) {
		t.Errorf("child %d still alive after Stop", pid)
	}
	if s.PID() != 0 {
		t.Errorf("PID() = %d after Stop, want 0", s.PID())
	}
	assertRefuses(t, endpoint)
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir after Stop: %v, want it gone", err)
	}
	assertNothingLeft(t, tmp)
	_, err = s.KillRestart(t.Context())
	t.Logf("KillRestart after Stop: %v", err)
	if !errors.Is(err, ErrNotServing) {
		t.Errorf("KillRestart after Stop: %v, want ErrNotServing", err)
	}

	// Nothing of etcdtemp or its readiness client keeps running in this process.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, stacks := clientGoroutines()
		if n <= before {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d etcdtemp/etcd client/gRPC goroutines after Stop, %d before Start:\n%s", n, before, stacks)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStopAfterChildDied(t *testing.T) {
	requireProc(t)
	s, err := Start(t.Context(), WithLog(testLog{t}))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := os.FindProcess(s.PID())
	p.Kill()
	for !s.proc.exited() {
		time.Sleep(10 * time.Millisecond)
	}
	_, err = s.KillRestart(t.Context())
	t.Logf("KillRestart of a dead server: %v", err)
	if !errors.Is(err, ErrNotServing) || !strings.Contains(err.Error(), "already exited") {
		t.Errorf("KillRestart of a dead server: %v, want ErrNotServing saying it had already exited", err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("Stop after the child died: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(s.DataDir())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir after Stop: %v, want it gone", err)
	}
}

func TestStartCancelled(t *testing.T) {
	requireProc(t)
	for _, tc := range []struct {
		name     string
		cancelAt string // cancel when a progress line starts with this; "" cancels before Start
	}{
		{name: "before start"},
		{name: "child running", cancelAt: "etcdtemp: starting etcd child"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.cancelAt == "" {
				cancel()
			}
			log := funcWriter(func(line string) {
				t.Log(strings.TrimSpace(line))
				if tc.cancelAt != "" && strings.HasPrefix(line, tc.cancelAt) {
					cancel()
				}
			})
			s, err := Start(ctx, WithLog(log))
			if err == nil {
				s.Stop()
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

func TestKillRestartCancelledKillsNothing(t *testing.T) {
	s := StartTB(t)
	pid := s.PID()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.KillRestart(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("KillRestart(cancelled) = %v, want context.Canceled", err)
	}
	if s.PID() != pid || pidGone(pid) {
		t.Errorf("KillRestart with a cancelled context touched the server: pid %d -> %d", pid, s.PID())
	}
}

func TestBadOptions(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, tc := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithHeartbeat(0)}, "WithHeartbeat(0s)"},
		{[]Option{WithHeartbeat(1500 * time.Microsecond)}, "whole, positive number of milliseconds"},
		{[]Option{WithElection(40 * time.Millisecond)}, "shorter than 5 heartbeats"},
		{[]Option{WithHeartbeat(time.Second), WithElection(time.Minute)}, "at most 50s"},
	} {
		s, err := Start(t.Context(), tc.opts...)
		if err == nil {
			s.Stop()
			t.Errorf("Start succeeded, want an error containing %q", tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %q, want it to contain %q", err, tc.want)
		}
	}
	assertNothingLeft(t, tmp)
}

// TestStartFailures drives the restart path into the failures it must explain: a client port
// taken by another program or by another etcd, and a binary without the Serve hook.
func TestStartFailures(t *testing.T) {
	requireProc(t)
	s := StartTB(t, WithLog(testLog{t}))
	other := StartTB(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc.kill()
	s.proc = nil
	s.pid.Store(0)
	ctx := t.Context()

	u, _ := url.Parse(s.clientURL)
	ln, err := net.Listen("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	_, err = s.startAndWait(ctx)
	ln.Close()
	t.Logf("port held by a listener: failed in %v: %v", time.Since(t1).Round(time.Millisecond), err)
	if !errors.Is(err, errPortInUse) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("err = %v, want errPortInUse quoting etcd's bind error", err)
	}

	saved := s.clientURL
	s.clientURL, s.serve.ClientURL = other.Endpoints()[0], other.Endpoints()[0]
	t1 = time.Now()
	_, err = s.startAndWait(ctx)
	s.clientURL, s.serve.ClientURL = saved, saved
	t.Logf("port held by another etcd: failed in %v: %v", time.Since(t1).Round(time.Millisecond), err)
	if !errors.Is(err, errPortInUse) {
		t.Errorf("err = %v, want errPortInUse", err)
	}

	exe, args := s.exe, s.args
	s.exe, s.args = "/bin/sh", []string{"-c", "echo no hook here; exit 3"}
	_, err = s.startAndWait(ctx)
	s.exe, s.args = exe, args
	t.Logf("binary without the hook: %v", err)
	if err == nil || !strings.Contains(err.Error(), "never ran etcdtemp.Serve") || !strings.Contains(err.Error(), "no hook here") {
		t.Errorf("err = %v, want the hint about the missing Serve hook and the child's output", err)
	}
	if s.proc != nil || s.PID() != 0 {
		t.Fatal("a child is recorded as running after failed starts")
	}

	// The data directory is intact: the next start comes back with the data.
	if _, err := s.startAndWait(ctx); err != nil {
		t.Fatal(err)
	}
	cli := newClient(t, other)
	if resp, err := cli.Get(ctx, "x"); err != nil || resp.Count != 0 {
		t.Errorf("the other server was disturbed: %v", err)
	}
}

// TestLeaseExpiry measures how long a 1-second lease takes to expire with the default timings:
// its key is deleted by the server's lease expiry, which runs every 500ms.
func TestLeaseExpiry(t *testing.T) {
	s := StartTB(t)
	cli := newClient(t, s)
	ctx := t.Context()

	const n = 5
	watch := cli.Watch(ctx, "lease/", clientv3.WithPrefix(), clientv3.WithFilterPut())
	granted := make([]time.Time, n) // read before each Grant request
	for i := range n {
		granted[i] = time.Now()
		lease, err := cli.Grant(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if lease.TTL != 1 {
			t.Fatalf("Grant(1) returned TTL %d: the server's minimum lease TTL is above 1s", lease.TTL)
		}
		put(t, cli, "lease/"+strconv.Itoa(i), "held", clientv3.WithLease(lease.ID))
		// Spread the grants over the expiry check's 500ms period.
		time.Sleep(100 * time.Millisecond)
	}

	var expiries []time.Duration
	timeout := time.After(10 * time.Second)
	for len(expiries) < n {
		select {
		case wr, ok := <-watch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch ended: %v", wr.Err())
			}
			now := time.Now()
			for _, ev := range wr.Events {
				if ev.Type != mvccpb.DELETE {
					continue
				}
				i, _ := strconv.Atoi(strings.TrimPrefix(string(ev.Kv.Key), "lease/"))
				d := now.Sub(granted[i])
				expiries = append(expiries, d)
				t.Logf("lease %d (TTL 1s): key gone %v after the grant request", i, d.Round(time.Millisecond))
				if d < time.Second {
					t.Errorf("lease %d: key gone after %v, before its 1s TTL", i, d)
				}
				if d > 2500*time.Millisecond {
					t.Errorf("lease %d: key gone only after %v, want about 1.0-1.6s", i, d)
				}
			}
		case <-timeout:
			t.Fatalf("only %d of %d leased keys expired within 10s", len(expiries), n)
		}
	}
	t.Logf("TTL 1s lease expiry: min %v, max %v (heartbeat 10ms, election 100ms)",
		slices.Min(expiries).Round(time.Millisecond), slices.Max(expiries).Round(time.Millisecond))
}

// TestNoOrphanWhenParentKilled kills a process that started a server with SIGKILL, so it cannot
// run Stop, and expects the server to go away anyway.
func TestNoOrphanWhenParentKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal exists only on Linux")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartAndHang$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ETCDTEMP_TEST_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	var endpoint, dataDir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "READY %d %s %s", &pid, &endpoint, &dataDir); err == nil {
			break
		}
	}
	if pid == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("helper did not report a started server")
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(dataDir)) }) // the killed helper could not
	cmd.Process.Kill()
	cmd.Wait()
	killed := time.Now()

	for !pidGone(pid) {
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("etcd child %d still running 10s after its parent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("etcd child %d gone %v after its parent was killed", pid, time.Since(killed).Round(time.Millisecond))
	assertRefuses(t, endpoint)
}

// TestHelperStartAndHang is not a test: TestNoOrphanWhenParentKilled runs it in a child process.
func TestHelperStartAndHang(t *testing.T) {
	if os.Getenv("ETCDTEMP_TEST_HELPER") != "1" {
		return
	}
	s, err := Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("READY %d %s %s\n", s.PID(), s.Endpoints()[0], s.DataDir())
	select {}
}

// TestWatchParent covers the guard against orphans used where there is no parent-death signal:
// a child whose parent pid is not the recorded one shuts down.
func TestWatchParent(t *testing.T) {
	select {
	case <-watchParent(os.Getpid()): // never our own parent
	case <-time.After(5 * time.Second):
		t.Fatal("watchParent did not notice a changed parent pid within 5s")
	}
}
