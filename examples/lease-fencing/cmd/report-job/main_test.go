package main

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// The test re-executes its own binary as report-job instances (the
// helper-process idiom), so they are real, separately stoppable processes.
const asMainEnv = "REPORT_JOB_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func instance(t *testing.T, leaseDSN, resDSN, holder string, extra ...string) *exec.Cmd {
	args := append([]string{"-lease-dsn", leaseDSN, "-resource-dsn", resDSN, "-holder", holder,
		"-ttl", "1s", "-renew", "250ms", "-margin", "200ms"}, extra...)
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	cmd.Stderr = os.Stderr
	return cmd
}

// TestPausedInstanceIsRejected is the README's demo: instance A passes its
// check, is frozen with SIGSTOP before its write, B takes over and writes,
// A is thawed and its write is rejected.
func TestPausedInstanceIsRejected(t *testing.T) {
	cluster := pgtemp.StartTB(t)
	ctx := t.Context()
	for _, db := range []string{"lease26", "res26"} {
		if err := cluster.CreateDatabase(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	leaseDSN, resDSN := cluster.DSN("lease26"), cluster.DSN("res26")

	a := instance(t, leaseDSN, resDSN, "holder-a", "-work", "200ms", "-write-delay", "3s")
	stdout, err := a.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Process.Signal(syscall.SIGCONT); _ = a.Process.Kill(); _ = a.Wait() }()
	lines := bufio.NewScanner(stdout)
	var aOut []string
	for lines.Scan() {
		aOut = append(aOut, lines.Text())
		if strings.Contains(lines.Text(), "check passed") {
			break
		}
	}
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	// Wait for the lease to expire by the database's clock.
	pool, err := pgxpool.New(ctx, leaseDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	leases, err := fencepg.NewLeaseStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := leases.Inspect(ctx, "daily-report")
		if err != nil {
			t.Fatal(err)
		}
		if !st.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A's lease never expired while A was frozen")
		}
		time.Sleep(20 * time.Millisecond)
	}

	b, err := instance(t, leaseDSN, resDSN, "holder-b", "-work", "100ms").Output()
	if err != nil {
		t.Fatalf("instance B: %v\n%s", err, b)
	}
	if !strings.Contains(string(b), "write ACCEPTED with token=2") {
		t.Fatalf("instance B did not write with token 2:\n%s", b)
	}

	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		aOut = append(aOut, lines.Text())
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("instance A: %v\n%s", err, strings.Join(aOut, "\n"))
	}
	if all := strings.Join(aOut, "\n"); !strings.Contains(all, "write REJECTED: token=1 is below the floor 2") {
		t.Fatalf("instance A's stale write was not rejected:\n%s", all)
	}

	// The report's own tables hold B's report only: header and every line.
	rpool, err := pgxpool.New(ctx, resDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer rpool.Close()
	var builtBy string
	var token int64
	var lineCount, bLines, aRows int
	err = rpool.QueryRow(ctx, `SELECT built_by, token, line_count,
		(SELECT count(*) FROM report_line WHERE scope = 'daily-report' AND text LIKE '%built by holder-b%'),
		(SELECT count(*) FROM report_line WHERE text LIKE '%holder-a%')
		FROM report_header WHERE scope = 'daily-report'`).Scan(&builtBy, &token, &lineCount, &bLines, &aRows)
	if err != nil {
		t.Fatal(err)
	}
	if builtBy != "holder-b" || token != 2 || lineCount != reportLines || bLines != reportLines || aRows != 0 {
		t.Fatalf("report tables: header by %s token %d with %d lines, %d lines by holder-b, %d rows of holder-a; want B's header and %d lines, none of A's",
			builtBy, token, lineCount, bLines, aRows, reportLines)
	}
}
