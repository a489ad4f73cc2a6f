package fencepg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestTokenSpaceGuards: a lease's token and a scope's floor only grow. The
// database refuses to delete, truncate or lower either — what a test
// cleanup or a hand-written fix-up would do, and what would make the next
// acquire issue tokens 1, 2, ... again — with SQLSTATE LF002 and a hint
// naming the administrative path, and changes nothing; the path itself
// (SET LOCAL leasefence_admin.allow_token_reset = on) works. The store's
// own statements (acquire's token + 1, the floor's GREATEST) pass.
func TestTokenSpaceGuards(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		g, err := f.leases.Acquire(ctx, "report-job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		g, err = f.leases.Acquire(ctx, "report-job", "holder-b", time.Minute)
		if err != nil || g.Token != 2 {
			t.Fatalf("second acquire: %+v, %v; want token 2", g, err)
		}
		if res, err := f.res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Content: "c", Writer: "holder-b", Token: 2}); err != nil || !res.Accepted {
			t.Fatalf("write: %+v, %v", res, err)
		}
		leaseBefore, floorBefore := f.leaseRow(t, "report-job"), f.floorRow(t, "s")

		for _, tc := range []struct {
			what string
			db   dbx.DB
			stmt string
		}{
			{"lower a lease's token", f.leaseDB, `UPDATE leasefence.lease SET token = 1 WHERE name = 'report-job'`},
			{"delete a lease", f.leaseDB, `DELETE FROM leasefence.lease WHERE name = 'report-job'`},
			{"truncate the leases", f.leaseDB, `TRUNCATE leasefence.lease`},
			{"lower a floor", f.resourceDB, `UPDATE leasefence.fence_floor SET max_token = 1 WHERE scope = 's'`},
			{"delete a floor", f.resourceDB, `DELETE FROM leasefence.fence_floor WHERE scope = 's'`},
			{"truncate the floors", f.resourceDB, `TRUNCATE leasefence.fence_floor CASCADE`},
		} {
			_, err := tc.db.Exec(ctx, tc.stmt)
			code, msg, hint := sqlError(err)
			if code != "LF002" || !strings.Contains(msg, "refused: tokens would be issued or accepted twice") ||
				!strings.Contains(hint, "SET LOCAL leasefence_admin.allow_token_reset = on") {
				t.Errorf("%s: err = %v (SQLSTATE %q, hint %q), want LF002 naming the administrative path", tc.what, err, code, hint)
			}
		}
		if got := f.leaseRow(t, "report-job"); got != leaseBefore {
			t.Errorf("a refused statement changed the lease: %s -> %s", leaseBefore, got)
		}
		if got := f.floorRow(t, "s"); got != floorBefore {
			t.Errorf("a refused statement changed the floor: %s -> %s", floorBefore, got)
		}

		// Raising is what the store does; lowering nothing is no reset.
		if _, err := f.resourceDB.Exec(ctx, `UPDATE leasefence.fence_floor SET max_token = max_token WHERE scope = 's'`); err != nil {
			t.Errorf("an update that keeps the floor: %v", err)
		}
		// The administrative path: deliberate, in one transaction.
		if _, err := f.leaseDB.Exec(ctx, `BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on;
			DELETE FROM leasefence.lease WHERE name = 'report-job'; COMMIT`); err != nil {
			t.Fatalf("the administrative path: %v", err)
		}
		if g, err := f.leases.Acquire(ctx, "report-job", "holder-c", time.Minute); err != nil || g.Token != 1 {
			t.Errorf("acquire after the deliberate reset: %+v, %v; want token 1", g, err)
		}
		// The setting was local to that transaction.
		if _, err := f.leaseDB.Exec(ctx, `DELETE FROM leasefence.lease`); err == nil {
			t.Error("a delete after the administrative transaction succeeded: the setting outlived it")
		}
	})
}

// sqlError returns the SQLSTATE, message and hint of a server error from
// either driver.
func sqlError(err error) (code, msg, hint string) {
	var pgErr *pgconn.PgError
	var pqErr *pq.Error
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code, pgErr.Message, pgErr.Hint
	case errors.As(err, &pqErr):
		return string(pqErr.Code), pqErr.Message, pqErr.Hint
	}
	return "", "", ""
}

func (f *fixture) floorRow(t *testing.T, scope string) string {
	t.Helper()
	var row string
	err := f.resourceDB.QueryRow(context.Background(),
		`SELECT coalesce((SELECT ff::text FROM leasefence.fence_floor ff WHERE scope = $1), '')`, scope).Scan(&row)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// TestCheckSchemaWantsTheGuards: a schema migrated before the token-space
// guards existed (here: one dropped) is out of date, and CheckSchema says
// so with ErrSchema naming the trigger; Migrate puts it back.
func TestCheckSchemaWantsTheGuards(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		if _, err := f.leaseDB.Exec(ctx, `DROP TRIGGER lease_never_deleted ON leasefence.lease`); err != nil {
			t.Fatal(err)
		}
		err := f.leases.CheckSchema(ctx)
		if !errors.Is(err, leasecore.ErrSchema) || !strings.Contains(err.Error(), "lacks its token-space guard (trigger lease_never_deleted)") {
			t.Fatalf("CheckSchema without a guard: %v, want ErrSchema naming lease_never_deleted", err)
		}
		// Migrate repairs it.
		if err := f.leases.Migrate(ctx); err != nil {
			t.Fatalf("Migrate on a schema missing a guard: %v", err)
		}
		if _, err := f.leases.Acquire(ctx, "report-job", "holder-a", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := f.leaseDB.Exec(ctx, `DELETE FROM leasefence.lease`); err == nil {
			t.Error("after Migrate a delete of the leases succeeded: the guard was not put back")
		}
	})
}
