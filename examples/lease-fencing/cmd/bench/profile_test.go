package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestProfile writes CPU profiles of the paths whose ratio to their limit
// or baseline misses its goal (docs/performance.md, "Profiles of the paths
// above their limit"). It checks nothing and runs only when -profile-dir
// is set:
//
//	go test -c -o /tmp/prof/bench.test ./cmd/bench/
//	/tmp/prof/bench.test -test.run '^TestProfile$' -test.timeout 30m -profile-dir /tmp/prof
//
// Each group (a fenced path and what its ratio compares it with) runs its
// variants in turn, in slices of -profile-slice, until each has run for
// -profile-time, so a slow moment of the machine lands on all of them, as
// in the bench. Per variant it writes, with perf installed:
//
//   - NAME.client.perf.data: `perf record` of this process (the client;
//     the etcd server is a child process, not in it) at 999 Hz, call
//     graphs from Go's frame pointers;
//   - NAME.server.perf.data: `perf record` of the server, the PostgreSQL
//     backends of the bench's resPool or the etcd child, likewise (see
//     startPerf for postgres's call graphs);
//
// each recording only while its variant's slices run. GROUP.client.pprof
// is Go's CPU profile of the whole group (100 Hz), each operation labelled
// variant=NAME (go tool pprof -tagfocus; the label stays on the calling
// goroutine: gRPC's own goroutines are not in it). summary.txt has, per
// variant, operations, wall time, client and server CPU time and client
// heap allocations per operation, and for etcd the server's counters per
// operation (etcdCounters). Then each etcd handoff variant runs alone
// (its campaigners only) for -profile-handoffs handoffs, profiled the same
// way, with the counters per handoff. Last, summary.txt gets one table per
// group and side of the perf samples by category (see rule and fold).
var (
	profileDir     = flag.String("profile-dir", "", "directory for TestProfile's profiles; empty: TestProfile is skipped")
	profileTime    = flag.Duration("profile-time", 20*time.Second, "how long TestProfile runs each single-client variant")
	profileSlice   = flag.Duration("profile-slice", time.Second, "how long TestProfile runs one variant before the next of its group")
	profileHandoff = flag.Int("profile-handoffs", 60, "handoffs TestProfile profiles per etcd handoff variant")
)

// profileGroups are the single-client variants TestProfile profiles: each
// fenced path with what its ratio compares it with.
var profileGroups = []struct {
	name     string
	variants []string
}{
	{"pipeline", []string{"pipeline_fenced", "pipeline_limit"}},
	{"user_tx", []string{"user_tx_fenced", "user_tx_fenced_no_idle", "user_tx_limit"}},
	{"etcd_lock", []string{"etcd_acquire_release", "etcd_acquire_release_limit", "etcd_mutex_lock_unlock"}},
}

// profiledHandoffs are the handoff variants TestProfile profiles.
var profiledHandoffs = []string{"etcd_campaign", "etcd_campaign_shared", "etcd_election"}

func TestProfile(t *testing.T) {
	if *profileDir == "" {
		t.Skip("set -profile-dir to write profiles")
	}
	if *profileSlice <= 0 || *profileTime < *profileSlice {
		t.Fatalf("-profile-slice %v, -profile-time %v: want 0 < slice <= time", *profileSlice, *profileTime)
	}
	ctx := t.Context()
	dir := *profileDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env, err := startEnv(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.close(); err != nil {
			t.Error(err)
		}
	}()
	variants, err := env.variants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]variant{}
	for _, v := range variants {
		byName[v.name] = v
	}
	pgPids, err := poolBackends(ctx, env.pg.resPool)
	if err != nil {
		t.Fatal(err)
	}
	etcdPid := env.etcd.srv.PID()
	metrics := env.etcd.srv.Endpoints()[0] + "/metrics"
	summary, err := os.Create(filepath.Join(dir, "summary.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer summary.Close()
	fmt.Fprintf(summary, "# %s, %d CPUs\n", env.describe(), runtime.NumCPU())
	fmt.Fprintf(summary, "# each variant %v in slices of %v, the variants of a group in turn, after 1 s of warm-up each;\n",
		*profileTime, *profileSlice)
	fmt.Fprintf(summary, "# CPU from getrusage (client) and /proc (server: PostgreSQL backends %v, etcd pid %d);\n", pgPids, etcdPid)
	fmt.Fprintf(summary, "# etcd variants: then the server's counters (requests by gRPC method, WAL fsyncs, raft entries committed, keys put and deleted) per operation\n")
	fmt.Fprintf(summary, "%-24s %8s %12s %14s %14s %10s\n", "variant", "ops", "wall µs/op", "client cpu µs", "server cpu µs", "allocs/op")
	var folds []fold
	for _, g := range profileGroups {
		var members []member
		for _, name := range g.variants {
			v, ok := byName[name]
			if !ok {
				t.Fatalf("group %s: no variant %s", g.name, name)
			}
			m := member{v: v, server: pgPids, dwarf: true}
			if strings.HasPrefix(name, "etcd_") {
				m.server, m.dwarf, m.metrics = []int{etcdPid}, false, metrics
			}
			members = append(members, m)
		}
		tallies, err := profileGroup(ctx, dir, g.name, members)
		if err != nil {
			t.Fatalf("group %s: %v", g.name, err)
		}
		client, server := fold{title: g.name + ", client (this process)", rules: goRules}, fold{title: g.name + ", server", rules: pgRules}
		if members[0].metrics != "" {
			server.rules = etcdRules
		}
		for i, tl := range tallies {
			name, n := members[i].v.name, float64(tl.ops)
			fmt.Fprintf(summary, "%-24s %8d %12.1f %14.1f %14.1f %10.1f", name, tl.ops, tl.wall.Seconds()*1e6/n,
				tl.client.Seconds()*1e6/n, tl.server.Seconds()*1e6/n, float64(tl.mallocs)/n)
			writeCounters(summary, tl.counters, n)
			fmt.Fprintln(summary)
			client.add(name, filepath.Join(dir, name+".client.perf.data"), tl.client.Seconds()*1e6/n)
			server.add(name, filepath.Join(dir, name+".server.perf.data"), tl.server.Seconds()*1e6/n)
		}
		folds = append(folds, client, server)
	}
	hf, err := profileHandoffs(ctx, env, dir, etcdPid, metrics, summary)
	if err != nil {
		t.Fatal(err)
	}
	folds = append(folds, hf...)
	// After every measurement: perf script takes seconds of CPU.
	if _, err := exec.LookPath("perf"); err == nil {
		for _, f := range folds {
			if err := f.write(summary); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// member is one variant of a profiled group: its server's processes and
// how perf unwinds their stacks.
type member struct {
	v       variant
	server  []int
	dwarf   bool
	metrics string // the etcd server's metrics URL; empty for PostgreSQL
}

// tally is what the slices of one variant measured, summed.
type tally struct {
	ops                  int
	wall, client, server time.Duration
	mallocs              uint64
	counters             map[string]float64
}

// profileGroup runs the members in turn, slice by slice, each under its own
// perf recorders (enabled only during its slices) and under one Go CPU
// profile of the group with each operation labelled by its variant.
func profileGroup(ctx context.Context, dir, group string, members []member) (_ []*tally, err error) {
	var recs [][2]*recorder // client, server
	defer func() {
		for _, r := range recs {
			err = errors.Join(err, r[0].stop(), r[1].stop())
		}
	}()
	for _, m := range members {
		c, err := startPerf(filepath.Join(dir, m.v.name+".client.perf.data"), []int{os.Getpid()}, false)
		if err != nil {
			return nil, err
		}
		s, err := startPerf(filepath.Join(dir, m.v.name+".server.perf.data"), m.server, m.dwarf)
		recs = append(recs, [2]*recorder{c, s})
		if err != nil {
			return nil, err
		}
	}
	tallies := make([]*tally, len(members))
	for i, m := range members {
		tallies[i] = &tally{counters: map[string]float64{}}
		if err := runFor(m.v, time.Second); err != nil { // warm-up
			return nil, err
		}
	}
	f, err := os.Create(filepath.Join(dir, group+".client.pprof"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, err
	}
	defer pprof.StopCPUProfile()
	for s := range int(*profileTime / *profileSlice) {
		for k := range members {
			i := (s + k) % len(members) // each slice starts with the next variant
			m, tl, rec := members[i], tallies[i], recs[i]
			var before map[string]float64
			if m.metrics != "" {
				if before, err = etcdCounters(ctx, m.metrics); err != nil {
					return nil, err
				}
			}
			var ops int
			meas, err := measure(m.server, rec, func() (err error) {
				pprof.Do(ctx, pprof.Labels("variant", m.v.name), func(context.Context) {
					ops, err = runCount(m.v, *profileSlice)
				})
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.v.name, err)
			}
			tl.ops += ops
			tl.wall += meas.wall
			tl.client += meas.client
			tl.server += meas.server
			tl.mallocs += meas.mallocs
			if m.metrics != "" {
				after, err := etcdCounters(ctx, m.metrics)
				if err != nil {
					return nil, err
				}
				for k, v := range after {
					tl.counters[k] += v - before[k]
				}
			}
		}
	}
	return tallies, nil
}

// runFor runs v's op for d.
func runFor(v variant, d time.Duration) error {
	_, err := runCount(v, d)
	return err
}

// runCount runs v's op for d and returns how many ran.
func runCount(v variant, d time.Duration) (int, error) {
	n := 0
	for deadline := time.Now().Add(d); time.Now().Before(deadline); n++ {
		if err := v.op(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// profileHandoffs profiles the etcd handoff variants one at a time: only
// that variant's campaigners run; one warm-up handoff, then -profile-handoffs
// handoffs under perf (NAME.client.perf.data, NAME.server.perf.data) and a
// Go CPU profile (NAME.client.pprof). The server's idle CPU comes first:
// the handoff phases include it (every handoff waits handoffSettle first).
func profileHandoffs(ctx context.Context, env *env, dir string, etcdPid int, metrics string, summary io.Writer) (_ []fold, err error) {
	contests, closers, err := env.handoffContests(ctx, defaultHandoffMembers)
	defer func() {
		for _, c := range slices.Backward(closers) {
			err = errors.Join(err, c())
		}
	}()
	if err != nil {
		return nil, err
	}
	client := fold{title: "etcd handoffs, client (this process), CPU per handoff", rules: goRules}
	server := fold{title: "etcd handoffs, server, CPU per handoff (idle included)", rules: etcdRules}
	idle0, t0 := procCPU([]int{etcdPid}), time.Now()
	time.Sleep(5 * time.Second)
	fmt.Fprintf(summary, "\n# etcd server idle (no campaigners yet): %.0f µs of CPU per second over %v\n",
		(procCPU([]int{etcdPid})-idle0).Seconds()*1e6/time.Since(t0).Seconds(), time.Since(t0).Round(time.Second))
	fmt.Fprintf(summary, "# etcd handoffs, %d per variant after one warm-up, each after %v of settling; per handoff: p50 (ms),\n"+
		"# CPU (µs), and the server's counters (as above) over the phase, divided by the handoffs\n",
		*profileHandoff, handoffSettle)
	for _, c := range contests {
		if !slices.Contains(profiledHandoffs, c.name) {
			continue
		}
		// Each variant's campaigners stop (and release) before the next
		// variant's start: their requests would land in its profile.
		cctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		stop := func() error { cancel(); wg.Wait(); return nil }
		closers = append(closers, stop)
		if err := c.start(cctx, &wg); err != nil {
			return nil, err
		}
		if _, err := c.sample(cctx); err != nil {
			return nil, err
		}
		var samples []float64
		var counters map[string]float64
		m, err := func() (_ measured, err error) {
			rc, err := startPerf(filepath.Join(dir, c.name+".client.perf.data"), []int{os.Getpid()}, false)
			defer func() { err = errors.Join(err, rc.stop()) }()
			if err != nil {
				return measured{}, err
			}
			rs, err := startPerf(filepath.Join(dir, c.name+".server.perf.data"), []int{etcdPid}, false)
			defer func() { err = errors.Join(err, rs.stop()) }()
			if err != nil {
				return measured{}, err
			}
			f, err := os.Create(filepath.Join(dir, c.name+".client.pprof"))
			if err != nil {
				return measured{}, err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return measured{}, err
			}
			defer pprof.StopCPUProfile()
			before, err := etcdCounters(ctx, metrics)
			if err != nil {
				return measured{}, err
			}
			m, err := measure([]int{etcdPid}, [2]*recorder{rc, rs}, func() error {
				for range *profileHandoff {
					d, err := c.sample(cctx)
					if err != nil {
						return err
					}
					samples = append(samples, float64(d.Nanoseconds())/1e6)
				}
				return nil
			})
			if err != nil {
				return m, err
			}
			after, err := etcdCounters(ctx, metrics)
			counters = map[string]float64{}
			for k, v := range after {
				counters[k] = v - before[k]
			}
			return m, err
		}()
		if err != nil {
			return nil, fmt.Errorf("handoff %s: %w", c.name, err)
		}
		n := float64(len(samples))
		client.add(c.name, filepath.Join(dir, c.name+".client.perf.data"), m.client.Seconds()*1e6/n)
		server.add(c.name, filepath.Join(dir, c.name+".server.perf.data"), m.server.Seconds()*1e6/n)
		fmt.Fprintf(summary, "%-22s p50 %.2f ms, client cpu %.0f µs, server cpu %.0f µs per handoff;", c.name, median(samples),
			m.client.Seconds()*1e6/n, m.server.Seconds()*1e6/n)
		writeCounters(summary, counters, n)
		fmt.Fprintln(summary)
		if err := stop(); err != nil {
			return nil, err
		}
	}
	return []fold{client, server}, nil
}

// writeCounters writes the counters that grew, divided by n.
func writeCounters(w io.Writer, counters map[string]float64, n float64) {
	for _, k := range slices.Sorted(maps.Keys(counters)) {
		if d := counters[k]; d > 0 {
			fmt.Fprintf(w, " %s %.2f", k, d/n)
		}
	}
}

// measured is what measure measured around its function: wall time, CPU
// time of this process and of the server processes, and this process's
// heap allocations.
type measured struct {
	wall, client, server time.Duration
	mallocs              uint64
}

// measure runs fn with the recorders rec (client, server) enabled and
// returns the wall time, the CPU time of this process and of the server
// processes pids, and this process's heap allocations that fn took.
func measure(pids []int, rec [2]*recorder, fn func() error) (m measured, err error) {
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	c0, s0 := selfCPU(), procCPU(pids)
	for _, r := range rec {
		if err := r.enable(); err != nil {
			return m, err
		}
	}
	t0 := time.Now()
	err = fn()
	m.wall = time.Since(t0)
	for _, r := range rec {
		err = errors.Join(err, r.disable())
	}
	m.client, m.server = selfCPU()-c0, procCPU(pids)-s0
	runtime.ReadMemStats(&ms1)
	m.mallocs = ms1.Mallocs - ms0.Mallocs
	return m, err
}

// recorder is a `perf record` process that records only while enabled; a
// nil recorder (no perf installed) does nothing.
type recorder struct {
	cmd      *exec.Cmd
	ctl, ack *os.File // perf's control pipe and its acknowledgements
	log      strings.Builder
}

// startPerf starts `perf record` of pids at 999 Hz with call graphs into
// out, disabled until enable; without perf, it returns a nil recorder. The
// call graphs of a Go process come from its frame pointers; Debian's
// postgres is built without them, so with dwarf its stacks are unwound from
// the DWARF unwind tables (a copy of each sample's stack: larger files).
func startPerf(out string, pids []int, dwarf bool) (*recorder, error) {
	if _, err := exec.LookPath("perf"); err != nil {
		return nil, nil
	}
	ids := make([]string, len(pids))
	for i, p := range pids {
		ids[i] = strconv.Itoa(p)
	}
	callGraph := "fp"
	if dwarf {
		callGraph = "dwarf"
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		return nil, errors.Join(err, ctlR.Close(), ctlW.Close())
	}
	r := &recorder{ctl: ctlW, ack: ackR}
	// The child's fds 3 and 4: ExtraFiles.
	r.cmd = exec.Command("perf", "record", "-q", "--delay", "-1", "--control", "fd:3,4",
		"--call-graph", callGraph, "-F", "999", "-o", out, "-p", strings.Join(ids, ","))
	r.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.log
	err = r.cmd.Start()
	err = errors.Join(err, ctlR.Close(), ackW.Close())
	if err != nil {
		return nil, errors.Join(err, ctlW.Close(), ackR.Close())
	}
	time.Sleep(500 * time.Millisecond) // perf attaches to the processes
	return r, nil
}

func (r *recorder) enable() error  { return r.command("enable") }
func (r *recorder) disable() error { return r.command("disable") }

// command sends a control command to perf and waits for its ack.
func (r *recorder) command(c string) error {
	if r == nil {
		return nil
	}
	if _, err := io.WriteString(r.ctl, c+"\n"); err != nil {
		return fmt.Errorf("perf %s: %w: %s", c, err, r.log.String())
	}
	buf := make([]byte, 8)
	if _, err := r.ack.Read(buf); err != nil {
		return fmt.Errorf("perf %s: no ack: %w: %s", c, err, r.log.String())
	}
	return nil
}

// stop ends perf, which writes its data file.
func (r *recorder) stop() error {
	if r == nil || r.cmd == nil {
		return nil
	}
	cmd := r.cmd
	r.cmd = nil
	defer r.ctl.Close()
	defer r.ack.Close()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		return err
	}
	// perf writes its data and then ends itself by the same signal.
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGINT {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("perf record: %w: %s", err, r.log.String())
	}
	return nil
}

// poolBackends returns the server pids of all of pool's connections
// (pg_backend_pid), holding all of them at once so each is asked once.
func poolBackends(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	var pids []int
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// selfCPU is the user and system CPU time of this process so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the user and system CPU time of pids so far, from
// /proc/<pid>/stat (clock ticks of 10 ms).
func procCPU(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th of them.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		for _, s := range f[11:13] {
			n, _ := strconv.ParseInt(s, 10, 64)
			total += time.Duration(n) * 10 * time.Millisecond
		}
	}
	return total
}

// etcdCounters reads from the etcd server's metrics endpoint its request
// counters by gRPC method, its WAL fsyncs, the raft entries it committed,
// and the keys its store put and deleted.
func etcdCounters(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var key string
		switch {
		case strings.HasPrefix(line, "grpc_server_handled_total{"):
			i := strings.Index(line, `grpc_method="`)
			if i < 0 {
				continue
			}
			method := line[i+len(`grpc_method="`):]
			key = method[:strings.IndexByte(method, '"')]
		case strings.HasPrefix(line, "etcd_disk_wal_fsync_duration_seconds_count "):
			key = "wal_fsync"
		case strings.HasPrefix(line, "etcd_server_proposals_committed_total "):
			key = "raft_committed"
		case strings.HasPrefix(line, "etcd_mvcc_put_total "):
			key = "mvcc_put"
		case strings.HasPrefix(line, "etcd_mvcc_delete_total "):
			key = "mvcc_delete"
		default:
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", url, line, err)
		}
		out[key] += v
	}
	return out, sc.Err()
}

// rule names a category of CPU samples: a sample is in the category of the
// first rule that a frame of its stack matches (pattern is a substring of
// the frame's symbol), the frames taken from the leaf up, rule by rule for
// each frame. So a sample is counted where the innermost known code is:
// pgx's work, with the allocations and system calls it makes, is pgx's.
type rule struct{ pattern, label string }

// pgRules are a PostgreSQL backend's stages, by exported functions
// (Debian's postgres has no symbols for its static ones).
var pgRules = []rule{
	{"XLogFlush", "commit: WAL flush (write, fdatasync)"},
	{"CommitTransactionCommand", "commit: the rest"},
	{"heap_lock_tuple", "executor: share lock of the floor row"},
	{"ExecInitNode", "executor start (plan nodes)"},
	{"standard_ExecutorStart", "executor start (plan nodes)"},
	{"PortalStart", "executor start (plan nodes)"},
	{"GetCachedPlan", "plan cache"},
	{"standard_ExecutorRun", "executor run"},
	{"PortalRun", "executor run"},
	{"PortalDrop", "executor end, portal drop"},
	{"standard_ExecutorEnd", "executor end, portal drop"},
	{"secure_read", "network: receive"},
	{"pq_getbyte", "network: receive"},
	{"secure_write", "network: send"},
	{"__libc_send", "network: send"},
	{"StartTransactionCommand", "transaction start"},
}

// etcdRules are the etcd server's parts, by package.
var etcdRules = []rule{
	{"runtime.newstack", "goroutine stack growth (morestack)"},
	{"wal.(*WAL).sync", "WAL fsync"},
	{"storage/wal", "WAL write"},
	{"go.etcd.io/bbolt", "backend (bbolt)"},
	{"storage/backend", "backend (bbolt)"},
	{"storage/mvcc", "mvcc (keys, revisions)"},
	{"server/v3/lease", "lessor"},
	{"etcdserver/txn", "apply: txn (compares, ops)"},
	{"etcdserver/apply", "apply: other"},
	{"go.etcd.io/raft", "raft"},
	{"etcdserver.(*raftNode)", "raft node"},
	{"google.golang.org/protobuf", "protobuf"},
	{"etcdserverpb", "protobuf"},
	{"mvccpb", "protobuf"},
	{"golang.org/x/net/http2", "http2"},
	{"google.golang.org/grpc", "grpc"},
	{"etcdserver", "etcdserver: the rest"},
	{"runtime.gcBgMarkWorker", "runtime: GC"},
	{"runtime.sysmon", "runtime: sysmon"},
	{"runtime.findRunnable", "runtime: scheduler"},
	{"runtime.schedule", "runtime: scheduler"},
}

// goRules are the client's packages.
var goRules = []rule{
	{"runtime.newstack", "goroutine stack growth (morestack)"},
	{"leasefence/fence-pg", "fence-pg"},
	{"leasefence/fence-etcd", "fence-etcd"},
	{"leasefence/leasecore", "leasecore"},
	{"jackc/pgx", "pgx"},
	{"jackc/puddle", "pgx"},
	{"etcd/client/v3/concurrency", "etcd concurrency"},
	{"go.etcd.io/etcd/client", "etcd clientv3"},
	{"go.etcd.io/etcd/api", "protobuf"},
	{"google.golang.org/protobuf", "protobuf"},
	{"google.golang.org/grpc", "grpc"},
	{"golang.org/x/net/http2", "http2"},
	{"lease-fencing/cmd/bench", "bench code"},
	{"runtime.gcBgMarkWorker", "runtime: GC"},
	{"runtime.sysmon", "runtime: sysmon"},
	{"runtime.findRunnable", "runtime: scheduler"},
	{"runtime.schedule", "runtime: scheduler"},
}

// fold is one table of summary.txt: the perf samples of several variants
// by category (rules), each as its share of the variant's samples and that
// share of its measured CPU time per operation.
type fold struct {
	title string
	rules []rule
	names []string
	files []string
	cpu   []float64 // µs per operation
}

func (f *fold) add(name, file string, cpu float64) {
	f.names, f.files, f.cpu = append(f.names, name), append(f.files, file), append(f.cpu, cpu)
}

func (f fold) write(w io.Writer) error {
	counts := make([]map[string]int, len(f.files))
	totals := make([]int, len(f.files))
	for i, file := range f.files {
		var err error
		if counts[i], totals[i], err = foldPerf(file, f.rules); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\n# %s: share of perf samples, and that share of the CPU time measured per operation (µs)\n", f.title)
	fmt.Fprintf(w, "%-40s", "category")
	for _, n := range f.names {
		fmt.Fprintf(w, " %24s", n)
	}
	fmt.Fprintf(w, "\n%-40s", "samples")
	for _, t := range totals {
		fmt.Fprintf(w, " %24d", t)
	}
	fmt.Fprintln(w)
	var labels []string
	for _, r := range f.rules {
		if !slices.Contains(labels, r.label) {
			labels = append(labels, r.label)
		}
	}
	for _, l := range append(labels, "other") {
		if !slices.ContainsFunc(counts, func(c map[string]int) bool { return c[l] > 0 }) {
			continue
		}
		fmt.Fprintf(w, "%-40s", l)
		for i := range f.files {
			share := 0.0
			if totals[i] > 0 {
				share = float64(counts[i][l]) / float64(totals[i])
			}
			fmt.Fprintf(w, " %14.1f%% %8.1f", 100*share, share*f.cpu[i])
		}
		fmt.Fprintln(w)
	}
	return nil
}

// foldPerf counts the samples of a perf data file by rule (see rule), and
// returns the counts by label ("other": no rule matched) and the total.
func foldPerf(file string, rules []rule) (map[string]int, int, error) {
	cmd := exec.Command("perf", "script", "-i", file)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	counts, total := map[string]int{}, 0
	var stack []string
	flush := func() {
		if len(stack) == 0 {
			return
		}
		total++
		label := "other"
	frames:
		for _, fr := range stack {
			for _, r := range rules {
				if strings.Contains(fr, r.pattern) {
					label = r.label
					break frames
				}
			}
		}
		counts[label]++
		stack = stack[:0]
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
		case line[0] != ' ' && line[0] != '\t': // a sample's header: its stack follows, leaf first
			flush()
		default: // a frame: address, symbol+offset, (object)
			if f := strings.Fields(line); len(f) > 1 {
				stack = append(stack, f[1])
			}
		}
	}
	flush()
	err = errors.Join(sc.Err(), cmd.Wait())
	if err != nil {
		return nil, 0, fmt.Errorf("perf script -i %s: %w: %s", file, err, stderr.String())
	}
	return counts, total, nil
}
