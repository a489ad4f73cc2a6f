//go:build linux

package fencepg_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// frozenTxEnv makes the test binary the holder of TestFenceFrozenInsideTx:
// it carries the holder's driver and DSN as JSON.
const frozenTxEnv = "FENCEPG_FROZEN_TX_HOLDER"

// init runs before TestMain: a holder process does nothing else.
func init() {
	if os.Getenv(frozenTxEnv) != "" {
		os.Exit(frozenTxHolderMain())
	}
}

type frozenTxSpec struct {
	Driver, DSN string
	Idle        time.Duration // the Fence's idle-in-transaction timeout
}

// frozenTxHolderMain is holder A: it runs RunTx with token 1; inside its
// function it writes the job's header, says IN_TX, and waits for a line on
// stdin before it writes a line and returns (the parent freezes it there).
// It then prints the outcome of RunTx.
func frozenTxHolderMain() int {
	var holder frozenTxSpec
	if err := json.Unmarshal([]byte(os.Getenv(frozenTxEnv)), &holder); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	pool, err := pgopen.Open(ctx, holder.Driver, holder.DSN, 2)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	fence, err := pool.Fence(fencepg.WithTimeouts(0, holder.Idle))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c := leasecore.Claim{Scope: "frozen", Writer: "holder-a", Token: 1}
	in := bufio.NewScanner(os.Stdin)
	wait := func() { fmt.Println("IN_TX"); in.Scan() }
	var res leasecore.Result
	if fence.Pgx != nil {
		res, err = fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 100); err != nil {
				return err
			}
			wait()
			_, err := tx.Exec(ctx, upsertLine, c.Scope, 1, 100)
			return err
		})
	} else {
		res, err = fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 100); err != nil {
				return err
			}
			wait()
			_, err := tx.ExecContext(ctx, upsertLine, c.Scope, 1, 100)
			return err
		})
	}
	fmt.Printf("RESULT accepted=%t floor=%d unavailable=%t err=%v\n", res.Accepted, res.Floor, errors.Is(err, leasecore.ErrUnavailable), err)
	return 0
}

// advanceBound is how long B's Advance may take while A is frozen inside
// its fenced transaction: the fence holds no lock for A, so B waits for
// nothing of A's; the bound only covers one statement on a busy machine.
const advanceBound = time.Second

// TestFenceFrozenInsideTx: holder A is frozen with SIGSTOP inside its
// fenced transaction (RunTx of Fence and FenceDB), after its first statement. The
// fence holds no lock for A: holder B's Advance with a newer token returns
// at once. B's own write of the rows A has written waits for A's row lock
// in the job's table (pg_stat_activity shows it; a writer with a short lock
// timeout gives up with ErrUnavailable), the one wait the fence does not
// remove.
//
//   - woken before its idle timeout: A goes on with its next statement and
//     its commit, which is rejected (the floor is B's token); B's write
//     then goes through; only B's rows exist.
//   - frozen past its idle timeout: the server ends A's session and rolls
//     back its transaction; B's write goes through then; A, thawed, gets
//     an error wrapping ErrUnavailable that names the idle timeout.
func TestFenceFrozenInsideTx(t *testing.T) {
	for _, tc := range []struct {
		name string
		idle time.Duration // A's idle-in-transaction timeout
		past bool          // A stays frozen until its session ended
	}{{"woken before its idle timeout", fencepg.DefaultIdleInTransactionTimeout, false}, {"frozen past its idle timeout", time.Second, true}} {
		t.Run(tc.name, func(t *testing.T) {
			pgtest.ForEachDriver(t, func(t *testing.T, driver string) { frozenInsideTx(t, driver, tc.idle, tc.past) })
		})
	}
}

func frozenInsideTx(t *testing.T, driver string, idle time.Duration, past bool) {
	f := newFenceFixture(t, driver)
	ctx := context.Background()
	cmd, stdin, lines := startHolderProcess(t, frozenTxEnv, frozenTxSpec{Driver: driver, DSN: f.resDSN, Idle: idle})
	pid := cmd.Process.Pid
	if !lines.Scan() || lines.Text() != "IN_TX" {
		t.Fatalf("holder A: %q, want IN_TX", lines.Text())
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if st := waitState(t, pid, "T"); st != "T" {
		t.Fatalf("holder A's state after SIGSTOP = %q, want T", st)
	}
	frozenAt := time.Now()

	// B cuts A off: nothing of the fence's waits for A.
	b := leasecore.Claim{Scope: "frozen", Writer: "holder-b", Token: 2}
	start := time.Now()
	res, err := f.fence.Advance(ctx, b)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	backendtest.WantResult(t, "B's advance while A is frozen inside its transaction", res, true, 2)
	if took > advanceBound {
		t.Fatalf("B's advance took %v with A frozen inside its transaction: it waited for A (bound %v)", took, advanceBound)
	}
	t.Logf("B's advance returned in %v with A frozen", took.Round(time.Microsecond))

	if !past {
		// A writer with a lock timeout gives up behind A's row lock in the
		// job's table, with an error that says so and wraps ErrUnavailable.
		impatient := openFence(t, f.resPool, fencepg.WithTimeouts(300*time.Millisecond, 0))
		var err2 error
		write := func(exec func(string, ...any) error) error {
			return exec(upsertRun, b.Scope, b.Writer, int64(b.Token), 1)
		}
		if impatient.Pgx != nil {
			_, err2 = impatient.Pgx.RunTx(ctx, b, func(tx pgx.Tx) error {
				return write(func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err })
			})
		} else {
			_, err2 = impatient.SQL.RunTx(ctx, b, func(tx *sql.Tx) error {
				return write(func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err })
			})
		}
		if !errors.Is(err2, leasecore.ErrUnavailable) || !strings.Contains(err2.Error(), "lock timeout") {
			t.Fatalf("B with a 300ms lock timeout behind frozen A's row: %v, want ErrUnavailable (lock timeout)", err2)
		}
	}

	// B writes the same rows; it waits for A's row lock in the job's table.
	type outcome struct {
		res leasecore.Result
		at  time.Time
	}
	done := make(chan outcome, 1)
	go func() {
		res := f.writeJob(t, b, 200)
		done <- outcome{res, time.Now()}
	}()
	if wait := f.waitLockWaiterOn(t, rowLockWaits); !strings.HasPrefix(wait, "Lock/") {
		t.Fatalf("B's wait = %q, want a lock wait (A's row)", wait)
	}
	thaw := func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(stdin, "GO")
		if !lines.Scan() {
			t.Fatal("holder A printed no result")
		}
	}
	var bDone outcome
	if past {
		select {
		case bDone = <-done:
		case <-time.After(idle + 10*time.Second):
			t.Fatal("B still waiting long after A's idle timeout")
		}
		if waited := bDone.at.Sub(frozenAt); waited < idle-100*time.Millisecond {
			t.Fatalf("B finished %v after A froze: before A's idle timeout %v ended A's session", waited, idle)
		}
		thaw()
		got := lines.Text()
		if !strings.HasPrefix(got, "RESULT accepted=false floor=0 unavailable=true ") || !strings.Contains(got, "idle_in_transaction_session_timeout") {
			t.Fatalf("holder A: %q, want an error wrapping ErrUnavailable that names idle_in_transaction_session_timeout", got)
		}
		t.Logf("holder A after its session was ended: %s", got)
	} else {
		thaw()
		if got := lines.Text(); !strings.HasPrefix(got, "RESULT accepted=false floor=2 unavailable=false err=<nil>") {
			t.Fatalf("holder A: %q, want its commit rejected by B's floor 2", got)
		}
		bDone = <-done
	}
	backendtest.WantResult(t, "B's write after A", bDone.res, true, 2)
	if got := f.job(t, "frozen"); got != "holder-b/2/200 lines=1:200,2:400" {
		t.Fatalf("rows = %q, want B's only", got)
	}
}

// waitState polls /proc until pid is in state want or 5 s passed.
func waitState(t *testing.T, pid int, want string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// The state follows the command name, which is in parentheses.
		s := string(b)
		st := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
		if st == want || time.Now().After(deadline) {
			return st
		}
		time.Sleep(time.Millisecond)
	}
}

// startHolderProcess starts the test binary again as a holder process: the
// environment variable env carries spec as JSON, and the binary's init
// hook for env runs the holder instead of the tests. The process dies with
// the test binary (Pdeathsig) and is thawed, killed and waited for when the
// test ends; registered after the caller's fixture, that cleanup runs
// first, so the holder and its session are gone before the pools close.
// It returns the started command (its Wait says how the holder exited),
// the holder's stdin and a scanner of its stdout.
func startHolderProcess(t *testing.T, env string, spec any) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+string(js))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, stdin, bufio.NewScanner(stdout)
}
