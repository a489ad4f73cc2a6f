package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
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

// spaceOf matches the token space of a PostgreSQL lease schema.
var spaceOf = regexp.MustCompile(`^postgres:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// secondLeaseService is another lease database on the same cluster,
// migrated: another lease service, with a token space of its own.
func secondLeaseService(t *testing.T, driver string) (*fencepg.LeaseStore, dbx.DB) {
	t.Helper()
	p := pgtest.Open(t, driver, pgtest.CreateDB(t, "lease_b_"+driver), 2)
	leases, err := p.LeaseStore()
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return leases, pgtest.DB(p)
}

// acquireTimes acquires and releases name n times on leases and returns
// the grants, tokens 1..n on a fresh name.
func acquireTimes(t *testing.T, leases *fencepg.LeaseStore, name, holder string, n int) []leasecore.Grant {
	t.Helper()
	ctx := context.Background()
	var gs []leasecore.Grant
	for range n {
		g, err := leases.Acquire(ctx, name, holder, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	return gs
}

// TestTokenSpaceOfGrants: every grant of a lease schema names its token
// space, "postgres:<uuid>", drawn once by the server when the schema was
// first migrated: Acquire, Renew, RenewAll and TakeOver carry the same
// one, Migrate again keeps it, and another lease database has another.
// CheckSchema wants the token_space function: without it the schema is out
// of date (ErrSchema naming it, an acquire fails with ErrSchema too), and
// Migrate makes one again.
func TestTokenSpaceOfGrants(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		g, err := f.leases.Acquire(ctx, "report-job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !spaceOf.MatchString(g.Space) {
			t.Fatalf("Acquire: Space = %q, want postgres:<uuid>", g.Space)
		}
		space := g.Space
		if r, err := f.leases.Renew(ctx, g); err != nil || r.Space != space {
			t.Errorf("Renew: %+v, %v; want space %q", r, err, space)
		}
		if rs, lost, err := f.leases.RenewAll(ctx, []leasecore.Grant{g}); err != nil || lost[0] != nil || rs[0].Space != space {
			t.Errorf("RenewAll: %+v, %v, %v; want space %q", rs, lost, err, space)
		}
		if tg, _, err := f.leases.TakeOver(ctx, "report-job", "operator", time.Minute); err != nil || tg.Space != space {
			t.Errorf("TakeOver: %+v, %v; want space %q", tg, err, space)
		}
		if err := f.leases.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if g, err := f.leases.Acquire(ctx, "other-job", "holder-a", time.Minute); err != nil || g.Space != space {
			t.Errorf("Acquire after Migrate again: %+v, %v; want the same space %q", g, err, space)
		}
		other, _ := secondLeaseService(t, driver)
		if g, err := other.Acquire(ctx, "report-job", "holder-a", time.Minute); err != nil || !spaceOf.MatchString(g.Space) || g.Space == space {
			t.Errorf("another lease database: %+v, %v; want a space of its own, not %q", g, err, space)
		}

		if _, err := f.leaseDB.Exec(ctx, `DROP FUNCTION leasefence.token_space()`); err != nil {
			t.Fatal(err)
		}
		wantErr(t, f.leases.CheckSchema(ctx), leasecore.ErrSchema, "function leasefence.token_space is missing", "run Migrate")
		_, err = f.leases.Acquire(ctx, "third-job", "holder-a", time.Minute)
		wantErr(t, err, leasecore.ErrSchema, "token_space", "run Migrate")
		if err := f.leases.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if g, err := f.leases.Acquire(ctx, "third-job", "holder-a", time.Minute); err != nil || !spaceOf.MatchString(g.Space) {
			t.Errorf("Acquire after Migrate made the function again: %+v, %v", g, err)
		}
	})
}

// wantTokenSpaceError checks a rejection by a floor from another token
// space: a rejected Result with the floor, and an error that is
// ErrTokenSpace (and ErrConfig) naming the claim's token and space, the
// floor and its space, and the rule.
func wantTokenSpaceError(t *testing.T, what string, res leasecore.Result, err error, c leasecore.Claim,
	floor leasecore.Token, floorSpace string) {
	t.Helper()
	if res.Accepted || res.Floor != floor {
		t.Errorf("%s: %+v, want rejected by floor %d", what, res, floor)
	}
	var tse *leasecore.TokenSpaceError
	if !errors.Is(err, leasecore.ErrTokenSpace) || !errors.Is(err, leasecore.ErrConfig) || !errors.As(err, &tse) {
		t.Errorf("%s: err = %v, want a *TokenSpaceError (ErrTokenSpace, ErrConfig)", what, err)
		return
	}
	if tse.Token != c.Token || tse.Space != c.Space || tse.Floor != floor || tse.FloorSpace != floorSpace || tse.Scope != c.Scope {
		t.Errorf("%s: %+v, want token %d of %q below floor %d of %q", what, tse, c.Token, c.Space, floor, floorSpace)
	}
	for _, w := range []string{c.Space, floorSpace, fmt.Sprintf("token %d", c.Token), fmt.Sprintf("floor %d", floor),
		"a scope is fenced by exactly one lease service"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: message %q lacks %q", what, err, w)
		}
	}
}

// TestTokenSpaceRejections: a scope fenced with tokens of lease service A
// (this fixture's lease database) and then written with tokens of lease
// service B (a second lease database, tokens 1, 2, ... again): every form
// of the fence rejects B's claim with a *leasecore.TokenSpaceError naming
// both spaces, writes nothing of B's, and leaves the floor and its space
// as they were; a stale token of A's own space is an ordinary rejection
// (no error), and so is B's claim without a space.
func TestTokenSpaceRejections(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx := context.Background()
		as := acquireTimes(t, f.leases, "report-job", "holder-a", 3)
		otherLeases, _ := secondLeaseService(t, driver)
		bs := acquireTimes(t, otherLeases, "report-job", "holder-b", 1)
		spaceA, b := as[0].Space, bs[0].Claim("nightly")
		if b.Space == spaceA || b.Token != 1 || as[2].Token != 3 {
			t.Fatalf("lease services: A %+v, B %+v; want two spaces, A at token 3, B at 1", as, bs)
		}

		// A fences the scope (Advance, then the job), and the part store's
		// scope too.
		a := as[2].Claim("nightly")
		if res, err := f.fence.Advance(ctx, a); err != nil || !res.Accepted {
			t.Fatalf("A's advance: %+v, %v", res, err)
		}
		backendtest.WantResult(t, "A's job", f.writeJob(t, a, 30), true, 3)
		aw := leasecore.Write{Scope: "report", Part: "summary", Content: "A's", Writer: a.Writer, Token: a.Token, Space: a.Space}
		if res, err := f.res.Write(ctx, aw); err != nil || !res.Accepted {
			t.Fatalf("A's part: %+v, %v", res, err)
		}
		before := f.floorRow(t, "nightly")
		if !strings.Contains(before, spaceA) {
			t.Fatalf("floor row %s does not store A's space %s", before, spaceA)
		}

		// B's claims, every form of the fence.
		called := false
		fn := func() error { called = true; return nil }
		if p := f.resPool.Pgx; p != nil {
			res, err := f.fence.Pgx.RunTx(ctx, b, func(pgx.Tx) error { return fn() })
			wantTokenSpaceError(t, "RunTx", res, err, b, 3, spaceA)
			tx, err := p.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res, err = f.fence.Pgx.Commit(ctx, tx, b)
			wantTokenSpaceError(t, "Commit", res, err, b, 3, spaceA)
			batch := &pgx.Batch{}
			batch.Queue(upsertRun, b.Scope, b.Writer, int64(b.Token), 99)
			res, err = f.fence.Pgx.SendBatch(ctx, p, b, batch)
			wantTokenSpaceError(t, "SendBatch", res, err, b, 3, spaceA)
		} else {
			res, err := f.fence.SQL.RunTx(ctx, b, func(*sql.Tx) error { return fn() })
			wantTokenSpaceError(t, "RunTx", res, err, b, 3, spaceA)
			tx, err := f.resPool.SQL.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err = f.fence.SQL.Commit(ctx, tx, b)
			wantTokenSpaceError(t, "Commit", res, err, b, 3, spaceA)
		}
		if called {
			t.Error("the rejected transaction's function ran")
		}
		res, err := f.fence.Advance(ctx, b)
		wantTokenSpaceError(t, "Advance", res, err, b, 3, spaceA)
		bw := leasecore.Write{Scope: "report", Part: "summary", Content: "B's", Writer: b.Writer, Token: b.Token, Space: b.Space}
		res, err = f.res.Write(ctx, bw)
		wantTokenSpaceError(t, "Resource.Write", res, err, backendkit.ClaimOf(bw), 3, spaceA)
		res, err = f.res.WriteBatch(ctx, leasecore.Batch{Scope: "report", Writer: b.Writer, Token: b.Token, Space: b.Space,
			Parts: []leasecore.PartContent{{Part: "summary", Content: "B's"}, {Part: "detail", Content: "B's"}}})
		wantTokenSpaceError(t, "Resource.WriteBatch", res, err, backendkit.ClaimOf(bw), 3, spaceA)
		t.Logf("B's write: %v", err)

		// A stale token of A's own space, and B's claim without its space:
		// ordinary rejections.
		for _, c := range []leasecore.Claim{as[1].Claim("nightly"), {Scope: "nightly", Writer: b.Writer, Token: b.Token}} {
			res, err := f.fence.Advance(ctx, c)
			if err != nil || res.Accepted || res.Floor != 3 {
				t.Errorf("claim %+v: %+v, %v; want an ordinary rejection by floor 3 (no error)", c, res, err)
			}
			res = f.writeJob(t, c, 40) // fails the test on any error
			backendtest.WantResult(t, fmt.Sprintf("job of claim %+v", c), res, false, 3)
			w := leasecore.Write{Scope: "report", Part: "summary", Content: "stale", Writer: c.Writer, Token: c.Token, Space: c.Space}
			if res, err := f.res.Write(ctx, w); err != nil || res.Accepted {
				t.Errorf("write %+v: %+v, %v; want an ordinary rejection (no error)", w, res, err)
			}
		}

		// Nothing of B's, or of the stale claims, was written.
		if got, want := f.job(t, "nightly"), "holder-a/3/30 lines=1:30,2:60"; got != want {
			t.Errorf("rows = %q, want A's %q", got, want)
		}
		if p, _, err := f.res.ReadPart(ctx, "report", "summary"); err != nil || p.Content != "A's" {
			t.Errorf("part = %+v, %v; want A's", p, err)
		}
		if got := f.floorRow(t, "nightly"); got != before {
			t.Errorf("floor row %s, want %s as it was", got, before)
		}
	})
}

// TestTokenSpaceFloorBeforeUpgrade: a fence_floor from before the
// token_space column is out of date (CheckSchema names the column), Migrate
// adds the column and keeps the floors, and a floor raised before that
// (no space) rejects a claim from another space as an ordinary stale one.
// Once a claim with a space raises the floor, the diagnosis is there.
func TestTokenSpaceFloorBeforeUpgrade(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx := context.Background()
		// The schema as it was: no token_space column, and a floor the old
		// statement raised (scope, max_token only).
		if _, err := f.resourceDB.Exec(ctx, `ALTER TABLE leasefence.fence_floor DROP COLUMN token_space;
			INSERT INTO leasefence.fence_floor (scope, max_token) VALUES ('nightly', 5)`); err != nil {
			t.Fatal(err)
		}
		wantErr(t, f.fence.CheckSchema(ctx), leasecore.ErrSchema, "leasefence.fence_floor has no column token_space", "run Migrate")
		if err := f.fence.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if got := f.floorRow(t, "nightly"); got != "(nightly,5,)" {
			t.Fatalf("floor row after Migrate = %s, want (nightly,5,): kept, space unknown", got)
		}
		otherLeases, _ := secondLeaseService(t, driver)
		b := acquireTimes(t, otherLeases, "report-job", "holder-b", 1)[0].Claim("nightly")
		if res, err := f.fence.Advance(ctx, b); err != nil || res.Accepted || res.Floor != 5 {
			t.Errorf("B below a floor of unknown space: %+v, %v; want an ordinary rejection", res, err)
		}
		backendtest.WantResult(t, "B's job below a floor of unknown space", f.writeJob(t, b, 1), false, 5)

		// A's token 6 raises the floor, and stores A's space.
		as := acquireTimes(t, f.leases, "report-job", "holder-a", 6)
		if res, err := f.fence.Advance(ctx, as[5].Claim("nightly")); err != nil || !res.Accepted {
			t.Fatalf("A's advance: %+v, %v", res, err)
		}
		res, err := f.fence.Advance(ctx, b)
		wantTokenSpaceError(t, "B after A raised the floor", res, err, b, 6, as[5].Space)
	})
}

// TestTokenSpaceBadInput: a space that is too long or holds a NUL is bad
// input: an *ArgError naming the field "space" and nothing written.
func TestTokenSpaceBadInput(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFenceFixture(t, driver)
		ctx := context.Background()
		before := f.snapshot(t)
		for _, space := range []string{strings.Repeat("s", backendkit.MaxNameLen+1), "postgres:\x00"} {
			c := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 1, Space: space}
			_, err := f.fence.Advance(ctx, c)
			wantSpaceArg(t, "Advance", err)
			_, err = f.res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1, Space: space})
			wantSpaceArg(t, "Write", err)
			_, err = f.leases.Renew(ctx, leasecore.Grant{Name: "n", Holder: "h", Token: 1, TTL: time.Minute, Space: space})
			wantSpaceArg(t, "Renew", err)
		}
		if after := f.snapshot(t); after != before {
			t.Errorf("bad input changed the databases:\n%s\n->\n%s", before, after)
		}
	})
}

func wantSpaceArg(t *testing.T, what string, err error) {
	t.Helper()
	var ae *leasecore.ArgError
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != "space" {
		t.Errorf("%s: %v, want an *ArgError for field space", what, err)
	}
}
