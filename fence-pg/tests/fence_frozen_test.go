//go:build linux

package fencepg_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgopen"
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
}

// frozenTxHolderMain is holder A: it runs RunTx with token 1 and the
// default timeouts; inside its function it writes the job's rows, says
// IN_TX, and waits for a line on stdin before returning (the parent
// freezes it there). It then prints the outcome of RunTx.
func frozenTxHolderMain() int {
	var spec frozenTxSpec
	if err := json.Unmarshal([]byte(os.Getenv(frozenTxEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	pool, err := pgopen.Open(ctx, spec.Driver, spec.DSN, 2)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	var fence *fencepg.Fence
	if pool.Pgx != nil {
		fence, err = fencepg.NewFence(pool.Pgx)
	} else {
		fence, err = fencepg.NewFenceDB(pool.SQL)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c := leasecore.Claim{Scope: "frozen", Writer: "holder-a", Token: 1}
	in := bufio.NewScanner(os.Stdin)
	wait := func() { fmt.Println("IN_TX"); in.Scan() }
	var res leasecore.Result
	if pool.Pgx != nil {
		res, err = fence.RunTx(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 100); err != nil {
				return err
			}
			wait()
			_, err := tx.Exec(ctx, upsertLine, c.Scope, 1, 100)
			return err
		})
	} else {
		res, err = fence.RunSQLTx(ctx, c, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 100); err != nil {
				return err
			}
			wait()
			_, err := tx.ExecContext(ctx, upsertLine, c.Scope, 1, 100)
			return err
		})
	}
	fmt.Printf("RESULT accepted=%t unavailable=%t err=%v\n", res.Accepted, errors.Is(err, leasecore.ErrUnavailable), err)
	return 0
}

// TestFenceFrozenInsideTx: holder A is frozen with SIGSTOP inside its
// fenced transaction, holding the floor row's lock. Holder B, with a newer
// token, queues behind it (pg_stat_activity shows B waiting on a lock) —
// until the server ends A's idle session after
// DefaultIdleInTransactionTimeout; then B is accepted (a writer with a
// short lock timeout gives up before, with ErrUnavailable). A, thawed, learns that its transaction is gone (an
// error wrapping leasecore.ErrUnavailable), and none of its rows appear.
func TestFenceFrozenInsideTx(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		spec, _ := json.Marshal(frozenTxSpec{Driver: driver, DSN: f.resDSN})
		cmd.Env = append(os.Environ(), frozenTxEnv+"="+string(spec))
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
		lines := bufio.NewScanner(stdout)
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

		// A writer with a lock timeout gives up behind frozen A, with an
		// error that says so and wraps ErrUnavailable.
		impatient := openFence(t, f.resPool, fencepg.WithTimeouts(300*time.Millisecond, 0))
		c := leasecore.Claim{Scope: "frozen", Writer: "holder-b", Token: 2}
		var err2 error
		if f.resPool.Pgx != nil {
			_, err2 = impatient.RunTx(context.Background(), c, func(pgx.Tx) error { return nil })
		} else {
			_, err2 = impatient.RunSQLTx(context.Background(), c, func(*sql.Tx) error { return nil })
		}
		if !errors.Is(err2, leasecore.ErrUnavailable) || !strings.Contains(err2.Error(), "lock timeout") {
			t.Fatalf("B with a 300ms lock timeout behind frozen A: %v, want ErrUnavailable (lock timeout)", err2)
		}

		// B writes with a newer token while A is frozen.
		type outcome struct {
			res leasecore.Result
			at  time.Time
		}
		done := make(chan outcome, 1)
		go func() {
			res := f.writeJob(t, leasecore.Claim{Scope: "frozen", Writer: "holder-b", Token: 2}, 200)
			done <- outcome{res, time.Now()}
		}()
		if wait := f.waitLockWaiter(t); !strings.HasPrefix(wait, "Lock/") {
			t.Fatalf("B's wait = %q, want a lock wait", wait)
		}
		var b outcome
		select {
		case b = <-done:
		case <-time.After(fencepg.DefaultIdleInTransactionTimeout + 10*time.Second):
			t.Fatal("B still waiting long after A's idle timeout")
		}
		backendtest.WantResult(t, "B after A's session ended", b.res, true, 2)
		if waited := b.at.Sub(frozenAt); waited < fencepg.DefaultIdleInTransactionTimeout-time.Second {
			t.Fatalf("B finished %v after A froze: it did not queue behind A's lock (idle timeout %v)",
				waited, fencepg.DefaultIdleInTransactionTimeout)
		} else {
			t.Logf("B waited %v behind frozen A (idle-in-transaction timeout %v)",
				waited.Round(time.Millisecond), fencepg.DefaultIdleInTransactionTimeout)
		}

		// A wakes and goes on with its transaction.
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(stdin, "GO")
		if !lines.Scan() {
			t.Fatal("holder A printed no result")
		}
		if got := lines.Text(); !strings.HasPrefix(got, "RESULT accepted=false unavailable=true ") {
			t.Fatalf("holder A: %q, want an error wrapping ErrUnavailable", got)
		}
		if got := f.job(t, "frozen"); got != "holder-b/2/200 lines=1:200,2:400" {
			t.Fatalf("rows = %q, want B's only", got)
		}
	})
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
