package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Moving a scope to another database: the fence's Seal in the old database's
// transaction that reads the job's rows, its Install in the new
// database's transaction that writes them (leasecore.ScopeSeal).

// dest is the label the old database records for the new one.
const dest = "db2"

// moveDatabases holds the second resource database per driver, created on
// first use and emptied by every newMoveTarget.
var moveDatabases sync.Map // driver -> DSN

// newMoveTarget returns a fence fixture on a second resource database,
// migrated, with the user's tables, and empty: where the tests move scopes
// to. Only its resource side is set (no lease database).
func newMoveTarget(t *testing.T, driver string) fenceFixture {
	t.Helper()
	dsn, ok := moveDatabases.Load(driver)
	if !ok {
		dsn, _ = moveDatabases.LoadOrStore(driver, pgtest.CreateDB(t, "res_moved_"+driver))
	}
	f := &fixture{driver: driver, resDSN: dsn.(string)}
	f.resPool = pgtest.Open(t, driver, f.resDSN, 4)
	f.resourceDB = pgtest.DB(f.resPool)
	var err error
	if f.res, err = f.resPool.Resource(fencepg.WithAttemptLog(leasecore.LogAll)); err != nil {
		t.Fatal(err)
	}
	if f.controls, err = f.resPool.Controls(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.controls.Migrate(ctx); err != nil { // fencepg's resource tables too
		t.Fatal(err)
	}
	for _, stmt := range []string{pgsql.TruncateResource, userSchema} {
		if _, err := f.resourceDB.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	return fenceFixture{f, openFence(t, f.resPool)}
}

// moveTx is one transaction of a move on either driver.
type moveTx struct {
	pgx pgx.Tx
	sql *sql.Tx
}

// beginMove begins a transaction on f's database; a test that ends
// before it does rolls it back (before the pool closes, which would wait
// for its connection).
func beginMove(t *testing.T, f fenceFixture) moveTx {
	t.Helper()
	ctx := context.Background()
	var m moveTx
	var err error
	if p := f.resPool.Pgx; p != nil {
		m.pgx, err = p.Begin(ctx)
	} else {
		m.sql, err = f.resPool.SQL.BeginTx(ctx, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.rollback)
	return m
}

func (m moveTx) seal(f fenceFixture, scope, to string) (leasecore.ScopeSeal, error) {
	if m.pgx != nil {
		return f.fence.Pgx.Seal(context.Background(), m.pgx, scope, to)
	}
	return f.fence.SQL.Seal(context.Background(), m.sql, scope, to)
}

func (m moveTx) install(f fenceFixture, s leasecore.ScopeSeal) (leasecore.Result, error) {
	if m.pgx != nil {
		return f.fence.Pgx.Install(context.Background(), m.pgx, s)
	}
	return f.fence.SQL.Install(context.Background(), m.sql, s)
}

func (m moveTx) exec(t *testing.T, stmt string, args ...any) {
	t.Helper()
	var err error
	if m.pgx != nil {
		_, err = m.pgx.Exec(context.Background(), stmt, args...)
	} else {
		_, err = m.sql.ExecContext(context.Background(), stmt, args...)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// rows reads the job's rows of scope in the transaction: the run's writer,
// token and total, and the lines' amounts, as values to insert again.
func (m moveTx) rows(t *testing.T, scope string) (run []any, lines [][2]int64) {
	t.Helper()
	ctx := context.Background()
	var (
		writer       string
		token, total int64
		err          error
	)
	if m.pgx != nil {
		err = m.pgx.QueryRow(ctx, `SELECT writer, token, total FROM job_run WHERE scope = $1`, scope).Scan(&writer, &token, &total)
	} else {
		err = m.sql.QueryRowContext(ctx, `SELECT writer, token, total FROM job_run WHERE scope = $1`, scope).Scan(&writer, &token, &total)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		t.Fatal(err)
	default:
		run = []any{writer, token, total}
	}
	const q = `SELECT line, amount FROM job_line WHERE scope = $1 ORDER BY line`
	scan := func(next func() bool, scan func(...any) error) {
		for next() {
			var l [2]int64
			if err := scan(&l[0], &l[1]); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l)
		}
	}
	if m.pgx != nil {
		rs, qerr := m.pgx.Query(ctx, q, scope)
		if qerr != nil {
			t.Fatal(qerr)
		}
		scan(rs.Next, rs.Scan)
		rs.Close()
		err = rs.Err()
	} else {
		rs, qerr := m.sql.QueryContext(ctx, q, scope)
		if qerr != nil {
			t.Fatal(qerr)
		}
		scan(rs.Next, rs.Scan)
		err = errors.Join(rs.Err(), rs.Close())
	}
	if err != nil {
		t.Fatal(err)
	}
	return run, lines
}

func (m moveTx) commit(t *testing.T) {
	t.Helper()
	var err error
	if m.pgx != nil {
		err = m.pgx.Commit(context.Background())
	} else {
		err = m.sql.Commit()
	}
	if err != nil {
		t.Fatal(err)
	}
}

func (m moveTx) rollback() {
	if m.pgx != nil {
		_ = m.pgx.Rollback(context.Background())
	} else {
		_ = m.sql.Rollback()
	}
}

// moveJob moves scope's job from old to to, as the README's recipe does:
// seal in old's transaction that reads the rows, install in to's
// transaction that writes them, each committed; an install that is
// rejected rolls back and writes nothing. withFloor false is the naive
// move: the rows copied, no seal and no install.
func moveJob(t *testing.T, old, to fenceFixture, scope string, withFloor bool) (leasecore.ScopeSeal, leasecore.Result) {
	t.Helper()
	var seal leasecore.ScopeSeal
	tx := beginMove(t, old)
	if withFloor {
		var err error
		if seal, err = tx.seal(old, scope, dest); err != nil {
			tx.rollback()
			t.Fatalf("seal %s: %v", scope, err)
		}
	}
	run, lines := tx.rows(t, scope)
	tx.commit(t)

	tx = beginMove(t, to)
	res := leasecore.Result{Accepted: true}
	if withFloor {
		var err error
		if res, err = tx.install(to, seal); err != nil {
			tx.rollback()
			t.Fatalf("install %+v: %v", seal, err)
		}
		if !res.Accepted {
			tx.rollback()
			return seal, res
		}
	}
	if run != nil {
		tx.exec(t, upsertRun, append([]any{scope}, run...)...)
	}
	for _, l := range lines {
		tx.exec(t, upsertLine, scope, l[0], l[1])
	}
	tx.commit(t)
	return seal, res
}

// wantMoved checks a rejection by a sealed scope: the sealed floor, and a
// *leasecore.ScopeMovedError naming the destination and the floor at the
// seal.
func wantMoved(t *testing.T, what string, res leasecore.Result, err error, token, sealFloor leasecore.Token) {
	t.Helper()
	if res.Accepted || res.Floor != leasecore.SealedFloor {
		t.Errorf("%s: %+v, want rejected by the sealed floor %d", what, res, leasecore.SealedFloor)
	}
	var me *leasecore.ScopeMovedError
	if !errors.Is(err, leasecore.ErrScopeMoved) || !errors.As(err, &me) {
		t.Errorf("%s: err = %v, want a *ScopeMovedError", what, err)
		return
	}
	if me.To != dest || me.Floor != sealFloor || me.Token != token {
		t.Errorf("%s: %+v, want to %q, floor %d at the seal, token %d", what, me, dest, sealFloor, token)
	}
	for _, other := range []error{leasecore.ErrUnavailable, leasecore.ErrTokenSpace, leasecore.ErrInvalidArgument} {
		if errors.Is(err, other) {
			t.Errorf("%s: %v wraps %v too", what, err, other)
		}
	}
	if !strings.Contains(err.Error(), `moved to "`+dest+`"`) {
		t.Errorf("%s: message %q does not name the destination", what, err)
	}
}

// TestMoveScope: B's job moves to the second database with its floor. A,
// whose token 1 was taken over before the move, is rejected at the new
// database as at the old; B writes on at the new one with its token; the
// old database rejects everybody, in every form of the check, saying where
// the scope went; its rows stay as they were.
func TestMoveScope(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		old, to := newFenceFixture(t, driver), newMoveTarget(t, driver)
		ctx := context.Background()
		a := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 1}
		b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 2}
		backendtest.WantResult(t, "A", old.writeJob(t, a, 10), true, 1)
		backendtest.WantResult(t, "B takes over", old.writeJob(t, b, 20), true, 2)

		seal, inst := moveJob(t, old, to, "nightly", true)
		if want := (leasecore.ScopeSeal{Scope: "nightly", To: dest, Floor: 2}); seal != want {
			t.Fatalf("seal = %+v, want %+v", seal, want)
		}
		backendtest.WantResult(t, "install", inst, true, 2)
		if got, want := to.job(t, "nightly"), "holder-b/2/20 lines=1:20,2:40"; got != want {
			t.Fatalf("rows at the new database = %q, want %q (B's, copied)", got, want)
		}
		for _, l := range []struct {
			what string
			f    fenceFixture
			want leasecore.Token
		}{{"old", old, leasecore.SealedFloor}, {"new", to, 2}} {
			if got, err := l.f.fence.Floor(ctx, "nightly"); err != nil || got != l.want {
				t.Errorf("floor at the %s database = %d, %v; want %d", l.what, got, err, l.want)
			}
		}

		// A, paused across the move, writes to the new database.
		backendtest.WantResult(t, "A at the new database", to.writeJob(t, a, 11), false, 2)
		backendtest.WantResult(t, "B at the new database", to.writeJob(t, b, 21), true, 2)
		if got, want := to.job(t, "nightly"), "holder-b/2/21 lines=1:21,2:42"; got != want {
			t.Fatalf("rows at the new database = %q, want %q (B's own)", got, want)
		}

		// The old database: every token rejected, in every form.
		for _, c := range []leasecore.Claim{a, b, {Scope: "nightly", Writer: "holder-c", Token: 3}, {Scope: "nightly", Writer: "holder-z", Token: backendkit.MaxToken}} {
			var res leasecore.Result
			var err error
			if old.fence.Pgx != nil {
				res, err = old.fence.Pgx.RunTx(ctx, c, func(pgx.Tx) error { return errors.New("ran under a sealed scope") })
			} else {
				res, err = old.fence.SQL.RunTx(ctx, c, func(*sql.Tx) error { return errors.New("ran under a sealed scope") })
			}
			wantMoved(t, fmt.Sprintf("token %d in a transaction at the old database", c.Token), res, err, c.Token, 2)
			res, err = old.fence.Advance(ctx, c)
			wantMoved(t, fmt.Sprintf("token %d advancing at the old database", c.Token), res, err, c.Token, 2)
		}
		tx := beginMove(t, old)
		var res leasecore.Result
		var err error
		if tx.pgx != nil {
			res, err = old.fence.Pgx.Commit(ctx, tx.pgx, b)
		} else {
			res, err = old.fence.SQL.Commit(ctx, tx.sql, b)
		}
		tx.rollback()
		wantMoved(t, "B's commit of its own transaction at the old database", res, err, 2, 2)
		if p := old.resPool.Pgx; p != nil {
			batch := &pgx.Batch{}
			batch.Queue(upsertRun, "nightly", "holder-b", 2, 99)
			res, err = old.fence.Pgx.SendBatch(ctx, p, b, batch)
			wantMoved(t, "B's pipeline at the old database", res, err, 2, 2)
		}
		res, err = old.res.Write(ctx, leasecore.Write{Scope: "nightly", Part: "summary", Content: "x", Writer: "holder-b", Token: 2})
		wantMoved(t, "B's part at the old database", res, err, 2, 2)
		if got, want := old.job(t, "nightly"), "holder-b/2/20 lines=1:20,2:40"; got != want {
			t.Errorf("rows at the old database = %q, want %q: unchanged since the seal", got, want)
		}
		if got, err := old.fence.Floor(ctx, "nightly"); err != nil || got != leasecore.SealedFloor {
			t.Errorf("floor at the old database after the rejections = %d, %v", got, err)
		}
		as, err := old.fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "nightly", Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		// Every attempt since the seal was logged as a rejection by the
		// sealed floor (the accepted ones before it are not logged).
		if len(as) < 10 {
			t.Errorf("attempt log at the old database: %d entries, want the 10 or more rejections since the seal", len(as))
		}
		for _, a := range as {
			if a.Accepted || a.Floor != leasecore.SealedFloor {
				t.Errorf("attempt log at the old database: %+v, want a rejection by the sealed floor", a)
			}
		}
	})
}

// TestMoveScopeIdempotent: the seal and the install can run again, as a
// move rerun after a crash does, and change nothing; a seal for another
// destination is refused with the first seal; an install is rejected, and
// writes nothing, where a newer token has been accepted since, and keeps
// the larger floor.
func TestMoveScopeIdempotent(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		old, to := newFenceFixture(t, driver), newMoveTarget(t, driver)
		ctx := context.Background()
		b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 2, Space: "postgres:one"}
		backendtest.WantResult(t, "B", old.writeJob(t, b, 20), true, 2)

		first, inst := moveJob(t, old, to, "nightly", true)
		backendtest.WantResult(t, "install", inst, true, 2)
		oldRow, newRow := old.floorRow(t, "nightly"), to.floorRow(t, "nightly")
		again, inst := moveJob(t, old, to, "nightly", true)
		if again != first {
			t.Errorf("second seal = %+v, want the first one's %+v", again, first)
		}
		backendtest.WantResult(t, "install again", inst, true, 2)
		if got := old.floorRow(t, "nightly"); got != oldRow {
			t.Errorf("old floor row after the second seal %s, want %s", got, oldRow)
		}
		if got := to.floorRow(t, "nightly"); !strings.HasPrefix(got, "(nightly,2,postgres:one)") || got != newRow {
			t.Errorf("new floor row after the second install %s, want %s: B's floor and space", got, newRow)
		}
		if got, want := to.job(t, "nightly"), "holder-b/2/20 lines=1:20,2:40"; got != want {
			t.Errorf("rows after the second move = %q, want %q", got, want)
		}

		// Another destination: the first seal, and the error.
		tx := beginMove(t, old)
		other, err := tx.seal(old, "nightly", "db3")
		tx.rollback()
		var me *leasecore.ScopeMovedError
		if other != first || !errors.As(err, &me) || me.To != dest || me.Floor != 2 || me.Token != 0 {
			t.Errorf("seal for db3: %+v, %v; want the seal for %s and a *ScopeMovedError", other, err, dest)
		}

		// C writes at the new database; the move rerun now would copy
		// older rows over C's: its install is rejected, nothing written.
		c := leasecore.Claim{Scope: "nightly", Writer: "holder-c", Token: 3, Space: "postgres:one"}
		backendtest.WantResult(t, "C at the new database", to.writeJob(t, c, 30), true, 3)
		_, inst = moveJob(t, old, to, "nightly", true)
		backendtest.WantResult(t, "install after C wrote", inst, false, 3)
		if got, want := to.job(t, "nightly"), "holder-c/3/30 lines=1:30,2:60"; got != want {
			t.Errorf("rows after the rejected install = %q, want %q (C's)", got, want)
		}
		if got, err := to.fence.Floor(ctx, "nightly"); err != nil || got != 3 {
			t.Errorf("floor after the rejected install = %d, %v; want 3, the larger", got, err)
		}
		wantFenceLog(t, to.fence, "nightly", "leasefence scope move/2/false/3")
	})
}

// TestMoveScopeCarriesTokenSpace: the seal carries the floor's token space,
// and the install stores it with the floor, so that at the new database a
// token of another lease service is still told apart from a stale one.
func TestMoveScopeCarriesTokenSpace(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		old, to := newFenceFixture(t, driver), newMoveTarget(t, driver)
		ctx := context.Background()
		b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 7, Space: "postgres:one"}
		backendtest.WantResult(t, "B", old.writeJob(t, b, 20), true, 7)
		seal, inst := moveJob(t, old, to, "nightly", true)
		if seal.Space != b.Space || seal.Floor != 7 {
			t.Fatalf("seal = %+v, want floor 7 of space %q", seal, b.Space)
		}
		backendtest.WantResult(t, "install", inst, true, 7)
		stranger := leasecore.Claim{Scope: "nightly", Writer: "holder-x", Token: 3, Space: "etcd:two"}
		res, err := to.fence.Advance(ctx, stranger)
		wantTokenSpaceError(t, "a token of another service at the new database", res, err, stranger, 7, b.Space)
		// At the old database the move is what it says, not the space.
		res, err = old.fence.Advance(ctx, stranger)
		wantMoved(t, "a token of another service at the old database", res, err, 3, 7)
	})
}

// TestMoveScopeNeverFenced: a scope that never had a floor is sealed with
// floor 0; installing it raises nothing, and is refused where the scope
// has a floor; a scope sealed at a database does not come back to it,
// except after the owner's reset.
func TestMoveScopeNeverFenced(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		old, to := newFenceFixture(t, driver), newMoveTarget(t, driver)
		ctx := context.Background()
		seal, inst := moveJob(t, old, to, "fresh", true)
		if want := (leasecore.ScopeSeal{Scope: "fresh", To: dest}); seal != want {
			t.Fatalf("seal = %+v, want %+v", seal, want)
		}
		backendtest.WantResult(t, "install of floor 0", inst, true, 0)
		if got := to.floorRow(t, "fresh"); got != "" {
			t.Errorf("floor row at the new database %q, want none", got)
		}
		a := leasecore.Claim{Scope: "fresh", Writer: "holder-a", Token: 1}
		res, err := old.fence.Advance(ctx, a)
		wantMoved(t, "A at the old database", res, err, 1, 0)
		backendtest.WantResult(t, "A at the new database", to.writeJob(t, a, 10), true, 1)
		_, inst = moveJob(t, old, to, "fresh", true)
		backendtest.WantResult(t, "install of floor 0 where A wrote", inst, false, 1)

		// Back to the old database: it is sealed there, and stays so.
		back := leasecore.ScopeSeal{Scope: "fresh", To: "db1", Floor: 1}
		tx := beginMove(t, old)
		res, err = tx.install(old, back)
		tx.rollback()
		wantMoved(t, "install back at the database the scope left", res, err, 1, 0)
		if err == nil || !strings.Contains(err.Error(), `install scope "fresh"`) {
			t.Errorf("install back: %v, want the op named", err)
		}

		// Unless the owner resets it (the administrative path Install's
		// godoc names): with the floor row gone the database is a new
		// location for the scope again.
		if _, err := old.resourceDB.Exec(ctx, `BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on;
			DELETE FROM leasefence.fence_floor WHERE scope = 'fresh'; COMMIT`); err != nil {
			t.Fatal(err)
		}
		tx = beginMove(t, old)
		res, err = tx.install(old, back)
		tx.rollback()
		if err != nil {
			t.Fatalf("install back after the reset: %v", err)
		}
		backendtest.WantResult(t, "install back after the reset", res, true, 1)
	})
}

// TestMoveScopeCutsOffOpenTransactions: a fenced transaction compares at
// commit and holds no lock of the fence's while it runs, so the seal does
// not wait for a transaction that is open (B's, paused in its function):
// it seals at once, and B's commit is then rejected by the sealed floor
// (*ScopeMovedError); the seal's transaction reads B's rows as they were
// committed before it, without the ones of the rejected transaction. A
// check after the seal waits for the seal's transaction and is rejected.
func TestMoveScopeCutsOffOpenTransactions(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		old := newFenceFixture(t, driver)
		ctx := context.Background()
		b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 2}
		backendtest.WantResult(t, "B", old.writeJob(t, b, 20), true, 2)

		// B's next transaction writes its run and pauses before its
		// commit.
		inFn, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		releaseB := func() { once.Do(func() { close(release) }) }
		t.Cleanup(releaseB)
		type outcome struct {
			res leasecore.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			write := func(exec func(string, ...any) error) error {
				if err := exec(upsertRun, "nightly", "holder-b", 2, 21); err != nil {
					return err
				}
				close(inFn)
				<-release
				return nil
			}
			if old.fence.Pgx != nil {
				o.res, o.err = old.fence.Pgx.RunTx(ctx, b, func(tx pgx.Tx) error {
					return write(func(s string, args ...any) error { _, err := tx.Exec(ctx, s, args...); return err })
				})
			} else {
				o.res, o.err = old.fence.SQL.RunTx(ctx, b, func(tx *sql.Tx) error {
					return write(func(s string, args ...any) error { _, err := tx.ExecContext(ctx, s, args...); return err })
				})
			}
			done <- o
		}()
		<-inFn
		sealed := make(chan leasecore.ScopeSeal, 1)
		tx := beginMove(t, old)
		go func() {
			s, err := tx.seal(old, "nightly", dest)
			if err != nil {
				t.Error(err)
			}
			sealed <- s
		}()
		var s leasecore.ScopeSeal
		select {
		case s = <-sealed:
		case <-time.After(10 * time.Second):
			t.Fatal("the seal waited for B's open transaction")
		}
		if s.Floor != 2 {
			t.Errorf("seal = %+v, want floor 2", s)
		}
		run, _ := tx.rows(t, "nightly")
		if fmt.Sprint(run) != "[holder-b 2 20]" {
			t.Errorf("the seal's transaction read %v, want B's committed run: [holder-b 2 20]", run)
		}

		// A check after the seal waits for the seal's transaction, and so
		// does B's comparison at commit.
		after := make(chan error, 1)
		go func() {
			res, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "nightly", Writer: "holder-c", Token: 3})
			if !errors.Is(err, leasecore.ErrScopeMoved) || res.Accepted {
				err = fmt.Errorf("%+v, %v: want rejected, scope moved", res, err)
			} else {
				err = nil
			}
			after <- err
		}()
		if w := old.waitLockWaiter(t); w == "" {
			t.Fatal("C's advance did not wait for the seal's transaction")
		}
		releaseB()
		tx.commit(t)
		if err := <-after; err != nil {
			t.Errorf("C's advance after the seal: %v", err)
		}
		o := <-done
		wantMoved(t, "B's transaction, open across the seal, at its commit", o.res, o.err, 2, 2)
		if got, want := old.job(t, "nightly"), "holder-b/2/20 lines=1:20,2:40"; got != want {
			t.Errorf("rows at the old database = %q, want %q: B's rejected transaction left nothing", got, want)
		}
	})
}

// TestMoveScopeBadInput: bad input to Seal and Install is an
// *ArgError naming the field, wrapping leasecore.ErrInvalidArgument, and
// nothing is written in either database.
func TestMoveScopeBadInput(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		old, to := newFenceFixture(t, driver), newMoveTarget(t, driver)
		ctx := context.Background()
		backendtest.WantResult(t, "B", old.writeJob(t, leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 2}, 20), true, 2)
		before, beforeNew := old.snapshot(t), to.floorRow(t, "nightly")

		for _, tc := range []struct {
			scope, to, field string
		}{
			{"", dest, "scope"}, {"a\x00b", dest, "scope"}, {strings.Repeat("s", backendkit.MaxNameLen+1), dest, "scope"},
			{"nightly", "", "to"}, {"nightly", " db2", "to"}, {"nightly", "db\n2", "to"},
		} {
			tx := beginMove(t, old)
			s, err := tx.seal(old, tc.scope, tc.to)
			tx.rollback()
			wantArgField(t, fmt.Sprintf("seal %q for %q", tc.scope, tc.to), err, tc.field)
			if s != (leasecore.ScopeSeal{}) {
				t.Errorf("seal %q for %q returned %+v with its error", tc.scope, tc.to, s)
			}
		}
		good := leasecore.ScopeSeal{Scope: "nightly", To: dest, Floor: 2}
		for _, tc := range []struct {
			what  string
			edit  func(*leasecore.ScopeSeal)
			field string
		}{
			{"no scope", func(s *leasecore.ScopeSeal) { s.Scope = "" }, "scope"},
			{"no destination", func(s *leasecore.ScopeSeal) { s.To = "" }, "to"},
			{"the sealed floor", func(s *leasecore.ScopeSeal) { s.Floor = leasecore.SealedFloor }, "floor"},
			{"a floor above every bigint", func(s *leasecore.ScopeSeal) { s.Floor = leasecore.SealedFloor + 1 }, "floor"},
			{"a space without a floor", func(s *leasecore.ScopeSeal) { s.Floor, s.Space = 0, "postgres:x" }, "space"},
			{"a space with NUL", func(s *leasecore.ScopeSeal) { s.Space = "postgres:\x00" }, "space"},
		} {
			s := good
			tc.edit(&s)
			tx := beginMove(t, to)
			res, err := tx.install(to, s)
			tx.rollback()
			wantArgField(t, "install with "+tc.what, err, tc.field)
			if res != (leasecore.Result{}) {
				t.Errorf("install with %s returned %+v with its error", tc.what, res)
			}
		}
		var err error
		if old.fence.Pgx != nil {
			_, err = old.fence.Pgx.Seal(ctx, nil, "nightly", dest)
		} else {
			_, err = old.fence.SQL.Seal(ctx, nil, "nightly", dest)
		}
		wantArgField(t, "Seal(nil)", err, "tx")
		if to.fence.Pgx != nil {
			_, err = to.fence.Pgx.Install(ctx, nil, good)
		} else {
			_, err = to.fence.SQL.Install(ctx, nil, good)
		}
		wantArgField(t, "Install(nil)", err, "tx")
		done, cancel := context.WithCancel(ctx)
		cancel()
		tx := beginMove(t, old)
		if tx.pgx != nil {
			_, err = old.fence.Pgx.Seal(done, tx.pgx, "nightly", dest)
		} else {
			_, err = old.fence.SQL.Seal(done, tx.sql, "nightly", dest)
		}
		tx.rollback()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("seal with a cancelled context: %v", err)
		}
		// The sealed floor is no token: a claim with it is refused.
		_, err = old.fence.Advance(ctx, leasecore.Claim{Scope: "nightly", Writer: "w", Token: leasecore.SealedFloor})
		wantArgField(t, "advance to the sealed floor", err, "token")

		if got := old.snapshot(t); got != before {
			t.Errorf("the old database changed:\n%s\nwant\n%s", got, before)
		}
		if got := to.floorRow(t, "nightly"); got != beforeNew {
			t.Errorf("the new database's floor changed: %q, want %q", got, beforeNew)
		}
	})
}

func wantArgField(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ae *leasecore.ArgError
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != field {
		t.Errorf("%s: %v, want an *ArgError naming %q", what, err, field)
		return
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: message %q does not name %q", what, err, field)
	}
}
