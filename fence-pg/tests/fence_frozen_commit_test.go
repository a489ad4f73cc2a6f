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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers database/sql driver "pgx"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/leasecore"
)

// commitPauseEnv makes the test binary holder A of
// TestFenceSQLFrozenBetweenCompareAndCommit: it carries commitPauseSpec as
// JSON.
const commitPauseEnv = "FENCEPG_SQL_COMMIT_PAUSE_HOLDER"

// init runs before TestMain: a holder process does nothing else.
func init() {
	if os.Getenv(commitPauseEnv) != "" {
		os.Exit(commitPauseHolderMain())
	}
}

type commitPauseSpec struct {
	SQLDriver, DSN string        // A's database/sql driver
	Idle           time.Duration // A's idle-in-transaction timeout
}

// commitPauseScope is the scope A and B share.
const commitPauseScope = "frozen-commit"

// commitPauseHolderMain is holder A: it advances the scope to token 1,
// then runs FenceDB.RunTx with token 1 and a context carrying
// commitgap.WithPause, which FenceDB runs between its comparison and its
// COMMIT. The pause prints "BEFORE_COMMIT <backend pid>" and waits for a
// line on stdin (the parent freezes A there); then A prints the outcome
// of RunTx.
func commitPauseHolderMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "holder A:", err); return 1 }
	var spec commitPauseSpec
	if err := json.Unmarshal([]byte(os.Getenv(commitPauseEnv)), &spec); err != nil {
		return fail(err)
	}
	db, err := sql.Open(spec.SQLDriver, spec.DSN)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	fence, err := fencepg.NewFenceDB(db, fencepg.WithTimeouts(0, spec.Idle))
	if err != nil {
		return fail(err)
	}
	c := leasecore.Claim{Scope: commitPauseScope, Writer: "holder-a", Token: 1}
	if res, err := fence.Advance(context.Background(), c); err != nil || !res.Accepted {
		return fail(fmt.Errorf("advance: %+v %v", res, err))
	}
	var backend int
	stdin := bufio.NewScanner(os.Stdin)
	ctx := commitgap.WithPause(context.Background(), func() {
		fmt.Printf("BEFORE_COMMIT %d\n", backend)
		stdin.Scan()
	})
	res, err := fence.RunTx(ctx, c, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 100); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, upsertLine, c.Scope, 1, 100); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&backend)
	})
	fmt.Printf("RESULT accepted=%t floor=%d unavailable=%t err=%v\n", res.Accepted, res.Floor, errors.Is(err, leasecore.ErrUnavailable), err)
	return 0
}

// commitPauseIdle is A's idle-in-transaction timeout: long enough that B
// surely starts, and is seen waiting, well before it ends A's session,
// even on a busy machine.
const commitPauseIdle = 2 * time.Second

// TestFenceSQLFrozenBetweenCompareAndCommit: on database/sql the fenced
// transaction's comparison and its COMMIT are two round trips (FenceDB.RunTx;
// FenceDB.Commit alike), and the comparison share-locks the scope's floor
// row until COMMIT. Holder A, a process of its own that pauses between the
// comparison and the COMMIT (commitgap.WithPause), is frozen with SIGSTOP right after the
// comparison returned: its session is idle in transaction, holding the
// lock. Holder B's Advance with a newer token then waits for A — it has
// not returned idle/2 after it started, and pg_stat_activity shows it
// waiting on a Lock that A's backend holds — until the server's
// idle-in-transaction timeout (WithTimeouts) ends A's session, and then
// returns accepted. A, thawed, fails to commit; none of its rows exist;
// the floor is B's token. With pgx (Fence.RunTx) the comparison and the
// COMMIT go in one round trip, so no freeze can fall between them; that
// case is TestFenceFrozenInsideTx's, where B waits for nothing.
func TestFenceSQLFrozenBetweenCompareAndCommit(t *testing.T) {
	for _, d := range []struct{ name, sqlDriver string }{{pgopen.Libpq, "postgres"}, {"pgx-stdlib", "pgx"}} {
		t.Run(d.name, func(t *testing.T) { frozenBetweenCompareAndCommit(t, d.sqlDriver, commitPauseIdle) })
	}
}

func frozenBetweenCompareAndCommit(t *testing.T, sqlDriver string, idle time.Duration) {
	// B's fence and the checks use lib/pq: B's driver does not matter, A's
	// does.
	f := newFenceFixture(t, pgopen.Libpq)
	ctx, cancel := context.WithTimeout(context.Background(), idle+30*time.Second)
	t.Cleanup(cancel)

	cmd, stdin, lines := startHolderProcess(t, commitPauseEnv, commitPauseSpec{SQLDriver: sqlDriver, DSN: f.resDSN, Idle: idle})
	pid := cmd.Process.Pid
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "BEFORE_COMMIT ") {
		t.Fatalf("holder A: %q, want BEFORE_COMMIT", lines.Text())
	}
	backend, err := strconv.Atoi(strings.TrimPrefix(lines.Text(), "BEFORE_COMMIT "))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if st := waitState(t, pid, "T"); st != "T" {
		t.Fatalf("holder A's state after SIGSTOP = %q, want T", st)
	}

	// A's session sits idle in its transaction after the comparison (its
	// last statement reads the floor table), COMMIT not sent; the server
	// started A's idle timeout when the comparison returned (state_change).
	var state, last string
	var idleSinceMicros int64
	if err := f.resourceDB.QueryRow(ctx, `SELECT state, query, (extract(epoch FROM state_change) * 1e6)::bigint
		FROM pg_stat_activity WHERE pid = $1`, backend).Scan(&state, &last, &idleSinceMicros); err != nil {
		t.Fatalf("holder A's session (backend %d): %v", backend, err)
	}
	if state != "idle in transaction" || !strings.Contains(last, "fence_floor") {
		t.Fatalf("holder A's session: state %q after %q, want idle in transaction after the comparison", state, last)
	}
	idleSince := time.UnixMicro(idleSinceMicros)

	// B cuts A off. B's Advance updates the floor row A's comparison
	// share-locked, so it waits for A's session to end.
	type outcome struct {
		res leasecore.Result
		err error
		at  time.Time
	}
	done := make(chan outcome, 1)
	b := leasecore.Claim{Scope: commitPauseScope, Writer: "holder-b", Token: 2}
	start := time.Now()
	go func() {
		res, err := f.fence.Advance(ctx, b)
		done <- outcome{res, err, time.Now()}
	}()
	early := func(o outcome) {
		t.Helper()
		t.Fatalf("B's Advance returned %v after it started (%+v, %v) with A frozen between its comparison and its COMMIT: "+
			"it did not wait for A's share lock of the floor row", o.at.Sub(start), o.res, o.err)
	}
	if wait := waitBlockedBy(t, f, backend, done, early); !strings.HasPrefix(wait, "Lock/") {
		t.Fatalf("B's wait = %q, want a lock wait behind A's backend %d", wait, backend)
	}
	select {
	case o := <-done:
		early(o)
	case <-time.After(time.Until(start.Add(idle / 2))):
	}

	var bDone outcome
	select {
	case bDone = <-done:
	case <-time.After(idle + 20*time.Second):
		t.Fatalf("B's Advance still waiting %v after it started: A's idle timeout %v did not end A's session", time.Since(start), idle)
	}
	if bDone.err != nil {
		t.Fatal(bDone.err)
	}
	backendtest.WantResult(t, "B's advance after A's session was ended", bDone.res, true, 2)
	// The bound: A's session idles from idleSince (before B started); the
	// server ends it idle later, which releases the lock, and B's one
	// statement then completes. advanceBound covers the server's timer
	// firing late and that statement on a busy machine. The 10 ms below
	// idle only absorbs the rounding of state_change to microseconds and
	// the two processes reading the same clock.
	waited, sinceIdle := bDone.at.Sub(start), bDone.at.Sub(idleSince)
	if sinceIdle < idle-10*time.Millisecond {
		t.Fatalf("B's Advance returned %v after A's session went idle: before A's idle timeout %v ended it", sinceIdle, idle)
	}
	if sinceIdle > idle+advanceBound {
		t.Fatalf("B's Advance returned %v after A's session went idle: more than its idle timeout %v + %v", sinceIdle, idle, advanceBound)
	}
	t.Logf("B's Advance waited %v (returned %v after A's comparison; idle timeout %v)",
		waited.Round(time.Millisecond), sinceIdle.Round(time.Millisecond), idle)

	// A, thawed, sends its COMMIT on a session the server has ended.
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "GO")
	if !lines.Scan() {
		t.Fatal("holder A printed no result")
	}
	got := lines.Text()
	if !strings.HasPrefix(got, "RESULT accepted=false floor=0 unavailable=true ") {
		t.Fatalf("holder A: %q, want a failed commit wrapping ErrUnavailable", got)
	}
	t.Logf("holder A after its session was ended: %s", got)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("holder A: %v", err)
	}
	if got := f.job(t, commitPauseScope); got != "- lines=-" {
		t.Fatalf("rows = %q, want none of A's", got)
	}
	if floor, err := f.fence.Floor(ctx, commitPauseScope); err != nil || floor != 2 {
		t.Fatalf("floor = %d, %v; want B's token 2", floor, err)
	}
}

// waitBlockedBy polls pg_stat_activity until a statement on the floor
// table waits for a lock that backend holds, and returns its wait event.
// A result on done first (the waiter never waited) goes to early.
func waitBlockedBy[T any](t *testing.T, f fenceFixture, backend int, done <-chan T, early func(T)) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case o := <-done:
			early(o)
			return ""
		default:
		}
		var wait string
		err := f.resourceDB.QueryRow(context.Background(), `SELECT coalesce(string_agg(wait_event_type || '/' || wait_event, ','), '')
			FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
			AND pid <> pg_backend_pid() AND query ILIKE '%fence_floor%' AND $1::int = ANY (pg_blocking_pids(pid))`, backend).Scan(&wait)
		if err != nil {
			t.Fatal(err)
		}
		if wait != "" {
			return wait
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no statement on the floor table started waiting for backend %d's lock within 10s", backend)
	return ""
}
