package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// TestMain doubles as the run's holder processes and etcd members.
func TestMain(m *testing.M) {
	switch {
	case etcdtemp.IsServeProcess():
		os.Exit(etcdtemp.Serve())
	case os.Getenv(workerEnv) != "":
		os.Exit(holdersMain())
	case os.Getenv(slowDiskEnv) != "":
		os.Exit(slowDiskMain())
	}
	os.Exit(m.Run())
}

// TestCapacitySmall runs every phase at a tiny scale (see runSmall).
func TestCapacitySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and etcd servers")
	}
	runSmall(t, allPhases, nil)
}

// TestCapacitySlowDisk runs the PostgreSQL holder-session and one-member
// etcd phases at TestCapacitySmall's scale on a slow disk: the servers run
// with their data on it, and the run unmounts it and puts TMPDIR back.
func TestCapacitySlowDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and etcd servers")
	}
	skipWithoutFUSE(t)
	// Not under t.TempDir(): PostgreSQL, running as postgres, must reach
	// its data directory on the mount.
	tmp := os.TempDir()
	delay := time.Millisecond
	report := runSmall(t, []string{"pg-sessions", "etcd-1"}, &delay)
	if !strings.Contains(report, "# A SLOWER DISK") || !strings.Contains(report, "returns 1ms later") {
		t.Errorf("the report does not say the disk was slowed by 1ms:\n%s", report)
	}
	if got := os.TempDir(); got != tmp {
		t.Errorf("TMPDIR after the run: %s, want %s again", got, tmp)
	}
	if mounts, err := os.ReadFile("/proc/self/mounts"); err != nil || strings.Contains(string(mounts), "/capacity-slow-disk-") {
		t.Errorf("a slow disk is still mounted after the run (%v):\n%s", err, mounts)
	}
}

// runSmall runs phases at a tiny scale (8 holders × 10 names, TTL 3 s, a
// 4 s window, two holder processes), on a slow disk when slowDisk is set,
// so the benchmark cannot rot: every phase must keep all its names, renew,
// measure both saturations and print its RATIO line. It checks no
// figure's size, and returns the report.
func runSmall(t *testing.T, phases []string, slowDisk *time.Duration) string {
	t.Helper()
	var out bytes.Buffer
	cfg := config{holders: 8, names: 10, procs: 2, conns: 2, ttl: 3 * time.Second, duration: 4 * time.Second, setupTimeout: time.Minute,
		phases: phases, satClients: 2, satTime: 300 * time.Millisecond, satRounds: 2, slowDisk: slowDisk,
		holderArgs: []string{"-test.run=^$"}, etcdArgs: []string{"-test.run=^$"}, slowDiskArgs: []string{"-test.run=^$"},
		stdout: &out, progress: io.Discard}
	if testing.Verbose() {
		cfg.progress = os.Stderr
	}
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	res, err := run(t.Context(), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.valid() {
		t.Fatal("run not valid: names lost or acquires failed")
	}
	report := out.String()
	for _, p := range res.phases {
		if p.skipped != "" {
			t.Logf("phase %s not run: %s", p.name, p.skipped)
			continue
		}
		if !regexp.MustCompile(`(?m)^RATIO ` + regexp.QuoteMeta(p.ratioName) + ` [0-9.]+$`).MatchString(report) {
			t.Errorf("no RATIO line for %s", p.ratioName)
		}
		// 8 holders renew every second: a 4 s window sees several rounds.
		if p.renewOK < 8 || p.renew <= 0 || p.upsert <= 0 {
			t.Errorf("%s: %d renewals in the window, saturation %.1f renewals/s, %.1f upserts/s", p.name, p.renewOK, p.renew, p.upsert)
		}
	}
	if !strings.Contains(report, "MISSED_LOCAL_DEADLINES 0\n") {
		t.Error("missed local deadlines, or no MISSED_LOCAL_DEADLINES line")
	}
	return report
}

func TestConfigCheck(t *testing.T) {
	base := config{holders: 10, names: 10, procs: 2, conns: 2, ttl: 15 * time.Second, duration: time.Second, setupTimeout: time.Minute,
		phases: allPhases, satClients: 2, satTime: time.Second, satRounds: 1}
	if err := base.check(); err != nil {
		t.Fatal(err)
	}
	if base.fullScale() {
		t.Error("10 × 10 is full scale")
	}
	for name, mod := range map[string]func(*config){
		"ttl not whole seconds":   func(c *config) { c.ttl = 1500 * time.Millisecond },
		"more procs than holders": func(c *config) { c.procs = 11 },
		"unknown phase":           func(c *config) { c.phases = []string{"mysql"} },
		"too many names":          func(c *config) { c.names = 1000 },
	} {
		c := base
		mod(&c)
		if c.check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	full := base
	full.holders, full.names, full.duration = 10000, 100, time.Minute
	if !full.fullScale() {
		t.Error("10,000 × 100 for 60 s is not full scale")
	}
}

// TestSlowDisk: -slow-disk's process mounts a directory whose flushes wait
// the delay, and stop unmounts it and removes its directories.
func TestSlowDisk(t *testing.T) {
	skipWithoutFUSE(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const delay = 20 * time.Millisecond
	d, err := startSlowDisk(t.Context(), exe, []string{"-test.run=^$"}, delay)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(d.mount, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < delay {
		t.Errorf("fsync on the slow disk took %v, want at least %v", took, delay)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.top); !os.IsNotExist(err) {
		t.Errorf("after stop, %s: %v; want it removed", d.top, err)
	}
}

func TestReportName(t *testing.T) {
	ms, none := time.Millisecond, time.Duration(0)
	for _, c := range []struct {
		slow    *time.Duration
		clients int
		want    string
	}{
		{nil, 16, "latest.txt"},
		{&ms, 16, "slow-disk-1ms.txt"},
		{&none, 16, "slow-disk-0s.txt"},
		{nil, 64, "latest-64-clients.txt"},
		{&ms, 64, "slow-disk-1ms-64-clients.txt"},
	} {
		cfg := config{slowDisk: c.slow, satClients: c.clients}
		if got := cfg.reportName(); got != c.want {
			t.Errorf("slow disk %v, %d clients: %s, want %s", c.slow != nil, c.clients, got, c.want)
		}
	}
}

// TestSlowDiskProcessFails: a mounting process that ends without mounting
// is an error, and its directories are gone.
func TestSlowDiskProcessFails(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	d, err := startSlowDisk(t.Context(), "/bin/false", nil, time.Millisecond)
	if err == nil {
		d.stop()
		t.Fatal("a process that mounted nothing: no error")
	}
	if !strings.Contains(err.Error(), "ended before it mounted") {
		t.Errorf("error %q, want it to say the process ended before it mounted", err)
	}
	if left, _ := os.ReadDir(os.TempDir()); len(left) != 0 {
		t.Errorf("left behind in TMPDIR: %v", left)
	}
}

// skipWithoutFUSE skips the test where a slow disk cannot be mounted.
func skipWithoutFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a FUSE file system needs root")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skip(err)
	}
	f.Close()
}
