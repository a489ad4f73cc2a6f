package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestSchemaNoCollision: the application's own tables called lease and
// fence_floor in public are left alone; the library's live in its schema,
// or in the one WithSchema names.
func TestSchemaNoCollision(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		dsn := pgtest.CreateDB(t, "collide_"+driver)
		p := pgtest.Open(t, driver, dsn, 4)
		ctx := context.Background()
		if _, err := pgtest.DB(p).Exec(ctx, `CREATE TABLE public.lease (id int PRIMARY KEY, tenant text);
			CREATE TABLE public.fence_floor (x int); INSERT INTO public.lease VALUES (1, 'acme')`); err != nil {
			t.Fatal(err)
		}
		for _, schema := range []string{fencepg.DefaultSchema, "jobs_fence"} {
			opts := []fencepg.Option{fencepg.WithSchema(schema)}
			leases, res := openStores(t, p, opts...)
			if err := leases.Migrate(ctx); err != nil {
				t.Fatalf("%s: migrate leases: %v", schema, err)
			}
			if err := res.Migrate(ctx); err != nil {
				t.Fatalf("%s: migrate resource: %v", schema, err)
			}
			g, err := leases.Acquire(ctx, "job", "h", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			r, err := res.Write(ctx, leasecore.Write{Scope: "job", Part: "p", Content: "c", Writer: "h", Token: g.Token})
			if err != nil || !r.Accepted {
				t.Fatalf("%s: write: %+v %v", schema, r, err)
			}
			var n int
			q := fmt.Sprintf(`SELECT (SELECT count(*) FROM %s.lease) + (SELECT count(*) FROM %s.fence_floor)`, schema, schema)
			if err := pgtest.DB(p).QueryRow(ctx, q).Scan(&n); err != nil || n != 2 {
				t.Fatalf("%s: library rows = %d, %v; want 2", schema, n, err)
			}
		}
		var tenant string
		if err := pgtest.DB(p).QueryRow(ctx, `SELECT tenant FROM public.lease WHERE id = 1`).Scan(&tenant); err != nil || tenant != "acme" {
			t.Fatalf("the application's own lease table: %q, %v", tenant, err)
		}
	})
}

func openStores(t *testing.T, p pgopen.Pool, opts ...fencepg.Option) (*fencepg.LeaseStore, *fencepg.Resource) {
	t.Helper()
	var leases *fencepg.LeaseStore
	var res *fencepg.Resource
	var err1, err2 error
	if p.Pgx != nil {
		leases, err1 = fencepg.NewLeaseStore(p.Pgx, opts...)
		res, err2 = fencepg.NewResource(p.Pgx, opts...)
	} else {
		leases, err1 = fencepg.NewLeaseStoreDB(p.SQL, opts...)
		res, err2 = fencepg.NewResourceDB(p.SQL, opts...)
	}
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return leases, res
}

// TestSchemaForeignOrOutdated: a table of the library's name that is not
// the library's (or an older version of it) is reported by Migrate and
// CheckSchema as ErrSchema naming the table and column, not as an SQL
// error at the first write.
func TestSchemaForeignOrOutdated(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, ddl, want string
	}{
		{"foreign lease table", `CREATE SCHEMA s; CREATE TABLE s.lease (id int PRIMARY KEY)`, "table s.lease has no column name"},
		{"floor of another type", `CREATE SCHEMA s; CREATE TABLE s.fence_floor (scope text PRIMARY KEY, max_token int NOT NULL)`,
			"column s.fence_floor.max_token is integer, want bigint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pgtest.Open(t, pgopen.Pgx, pgtest.CreateDB(t, "foreign"), 2)
			if _, err := pgtest.DB(p).Exec(ctx, tc.ddl); err != nil {
				t.Fatal(err)
			}
			leases, res := openStores(t, p, fencepg.WithSchema("s"))
			err := errors.Join(leases.Migrate(ctx), res.Migrate(ctx))
			if !errors.Is(err, leasecore.ErrSchema) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("migrate: %v, want ErrSchema saying %q", err, tc.want)
			}
		})
	}
	// Not migrated at all: CheckSchema says so at start-up.
	p := pgtest.Open(t, pgopen.Libpq, pgtest.CreateDB(t, "empty"), 2)
	leases, res := openStores(t, p)
	for _, err := range []error{leases.CheckSchema(ctx), res.CheckSchema(ctx)} {
		if !errors.Is(err, leasecore.ErrSchema) || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("check schema of an empty database: %v, want ErrSchema (missing)", err)
		}
	}
}

// TestDefaultSchemaMatchesSQL: the exported default is the schema the SQL
// text names (it is spelled out for godoc readers).
func TestDefaultSchemaMatchesSQL(t *testing.T) {
	if fencepg.DefaultSchema != pgsql.DefaultSchema {
		t.Fatalf("fencepg.DefaultSchema %q != pgsql.DefaultSchema %q", fencepg.DefaultSchema, pgsql.DefaultSchema)
	}
}

// TestSchemaName: a schema name that would need quoting, or is reserved,
// is bad input naming the schema field; the DDL functions check it too.
func TestSchemaName(t *testing.T) {
	p := pgtest.Open(t, pgopen.Pgx, pgtest.CreateDB(t, "names"), 1)
	for _, name := range []string{"", "Jobs", "1st", "pg_jobs", "a-b", `x"; DROP SCHEMA public; --`, strings.Repeat("a", 64)} {
		for what, err := range map[string]error{
			"NewLeaseStore": func() error { _, err := fencepg.NewLeaseStore(p.Pgx, fencepg.WithSchema(name)); return err }(),
			"NewFence":      func() error { _, err := fencepg.NewFence(p.Pgx, fencepg.WithSchema(name)); return err }(),
			"LeaseDDL":      func() error { _, err := fencepg.LeaseDDL(name); return err }(),
			"ResourceDDL":   func() error { _, err := fencepg.ResourceDDL(name); return err }(),
		} {
			var ae *leasecore.ArgError
			if !errors.As(err, &ae) || ae.Field != "schema" || !errors.Is(err, leasecore.ErrInvalidArgument) {
				t.Errorf("%s(%q): %v, want an ArgError naming schema", what, name, err)
			}
		}
	}
	ddl, err := fencepg.ResourceDDL("jobs_fence")
	if err != nil || !strings.Contains(ddl, "jobs_fence.fence_floor") || strings.Contains(ddl, fencepg.DefaultSchema+".") {
		t.Fatalf("ResourceDDL(jobs_fence) = %v:\n%s", err, ddl)
	}
}

// TestRuntimeRole: the owner migrates with its own migration tool (the
// exported DDL); a runtime role with only the grants the documentation
// lists — no CREATE anywhere — runs every operation.
func TestRuntimeRole(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		db := "runtime_" + driver
		dsn := pgtest.CreateDB(t, db)
		owner := pgtest.Open(t, driver, dsn, 1)
		leaseDDL, err1 := fencepg.LeaseDDL("app_fence")
		resDDL, err2 := fencepg.ResourceDDL("app_fence")
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		role := "lf_runtime_" + driver
		grants := fmt.Sprintf(`
			DO $$ BEGIN CREATE ROLE %[1]s LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
			REVOKE CREATE ON SCHEMA public FROM PUBLIC;
			CREATE TABLE public.job_run (scope text PRIMARY KEY, total int NOT NULL);
			GRANT SELECT, INSERT, UPDATE ON public.job_run TO %[1]s;
			GRANT USAGE ON SCHEMA app_fence TO %[1]s;
			GRANT SELECT, INSERT, UPDATE ON app_fence.lease TO %[1]s;
			GRANT SELECT, INSERT, UPDATE ON app_fence.fence_floor, app_fence.report_part TO %[1]s;
			GRANT SELECT, INSERT, DELETE ON app_fence.write_attempt TO %[1]s;`, role)
		for _, s := range []string{leaseDDL, resDDL, grants} {
			if _, err := pgtest.DB(owner).Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role) // the throwaway cluster trusts loopback connections
		p := pgtest.Open(t, driver, u.String(), 2)
		var canCreate bool
		if err := pgtest.DB(p).QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE') OR has_schema_privilege('public', 'CREATE') OR has_schema_privilege('app_fence', 'CREATE')`).Scan(&canCreate); err != nil || canCreate {
			t.Fatalf("runtime role can create: %t, %v", canCreate, err)
		}
		opt := fencepg.WithSchema("app_fence")
		leases, res := openStores(t, p, opt)
		fence := openFence(t, p, opt)
		if err := errors.Join(leases.CheckSchema(ctx), res.CheckSchema(ctx), fence.CheckSchema(ctx)); err != nil {
			t.Fatalf("check schema as the runtime role: %v", err)
		}
		g, err := leases.Acquire(ctx, "job", "h", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if g, err = leases.Renew(ctx, g); err != nil {
			t.Fatal(err)
		}
		if _, err := leases.Inspect(ctx, "job"); err != nil {
			t.Fatal(err)
		}
		c := leasecore.Claim{Scope: "job", Writer: "h", Token: g.Token}
		if r, err := fence.Advance(ctx, c); err != nil || !r.Accepted {
			t.Fatalf("advance: %+v %v", r, err)
		}
		write := func(tok leasecore.Token) (leasecore.Result, error) {
			c := leasecore.Claim{Scope: "job", Writer: "h", Token: tok}
			if p.Pgx != nil {
				return fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO public.job_run VALUES ('job', 1) ON CONFLICT (scope) DO UPDATE SET total = 2`)
					return err
				})
			}
			return fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO public.job_run VALUES ('job', 1) ON CONFLICT (scope) DO UPDATE SET total = 2`)
				return err
			})
		}
		if r, err := write(g.Token); err != nil || !r.Accepted {
			t.Fatalf("fenced transaction: %+v %v", r, err)
		}
		// Commit of a transaction of the caller's, in the configured schema.
		var checked leasecore.Result
		if p.Pgx != nil {
			tx, err := p.Pgx.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if checked, err = fence.Pgx.Commit(ctx, tx, c); err != nil {
				t.Fatalf("commit: %v", err)
			}
		} else {
			tx, err := p.SQL.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if checked, err = fence.SQL.Commit(ctx, tx, c); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
		if !checked.Accepted {
			t.Fatalf("commit: %+v", checked)
		}
		if r, err := write(g.Token); err != nil || !r.Accepted { // an equal token writes again
			t.Fatalf("fenced transaction again: %+v %v", r, err)
		}
		if p.Pgx != nil {
			b := &pgx.Batch{}
			b.Queue(`UPDATE public.job_run SET total = 3 WHERE scope = 'job'`)
			if r, err := fence.Pgx.SendBatch(ctx, p.Pgx, leasecore.Claim{Scope: "job", Writer: "old", Token: g.Token + 1}, b); err != nil || !r.Accepted {
				t.Fatalf("pipeline: %+v %v", r, err)
			}
		}
		if r, err := fence.Advance(ctx, leasecore.Claim{Scope: "job", Writer: "new", Token: g.Token + 1}); err != nil || !r.Accepted {
			t.Fatalf("advance to a newer token: %+v %v", r, err)
		}
		if r, err := res.Write(ctx, leasecore.Write{Scope: "job", Part: "p", Content: "c", Writer: "h", Token: g.Token}); err != nil || r.Accepted {
			t.Fatalf("stale part write: %+v %v, want a logged rejection", r, err)
		}
		if as, err := fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "job", Limit: 10}); err != nil || len(as) != 1 {
			t.Fatalf("attempts: %+v %v", as, err)
		}
		if _, err := fence.PruneAttempts(ctx, "job", time.Now()); err != nil {
			t.Fatalf("prune: %v", err)
		}
		if err := leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	})
}
