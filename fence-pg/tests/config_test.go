package fencepg_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// Errors that come from how a deployment is configured, against the real
// server: a refused DSN, missing grants, a pooler that breaks prepared
// statements, the server's own timeouts, fsync off, a database nobody
// migrated. Each error is checked for its sentinel (errors.Is) and for the
// words of its message that tell the operator what to change.

// wantErr fails the test unless err wraps want, wraps none of the other
// sentinels a retry loop tells apart, and its message contains each of
// words.
func wantErr(t *testing.T, err, want error, words ...string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want an error wrapping %v", err, want)
	}
	for _, other := range []error{leasecore.ErrConfig, leasecore.ErrUnavailable, leasecore.ErrSchema,
		context.Canceled, context.DeadlineExceeded} {
		if other != want && !errors.Is(want, other) && errors.Is(err, other) {
			t.Errorf("%v wraps %v too", err, other)
		}
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q lacks %q", err, w)
		}
	}
}

// lazyPool opens a pool of driver on dsn without connecting, as an
// application does: the first operation connects.
func lazyPool(t *testing.T, driver, dsn string) pgopen.Pool {
	t.Helper()
	switch driver {
	case pgopen.Pgx:
		p, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return pgopen.Pool{Pgx: p}
	default:
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return pgopen.Pool{SQL: db}
	}
}

// withUser returns dsn with another user (and password, if not "") or
// database (if not "").
func withUser(t *testing.T, dsn, user, password, database string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case user != "" && password != "":
		u.User = url.UserPassword(user, password)
	case user != "":
		u.User = url.User(user)
	}
	if database != "" {
		u.Path = "/" + database
	}
	return u.String()
}

// createRole creates a login role (or finds it from an earlier subtest)
// and runs extra, with %[1]s the role, as the superuser in db.
func createRole(t *testing.T, db interface {
	Exec(context.Context, string, ...any) (int64, error)
}, role, extra string) {
	t.Helper()
	stmt := fmt.Sprintf(`DO $$ BEGIN CREATE ROLE %[1]s LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;`+extra, role)
	if _, err := db.Exec(context.Background(), stmt); err != nil {
		t.Fatal(err)
	}
}

// runtimeGrants are the grants LeaseDDL and ResourceDDL document, on the
// default schema.
const runtimeGrants = `
	GRANT USAGE ON SCHEMA leasefence TO %[1]s;
	GRANT SELECT, INSERT, UPDATE ON leasefence.lease TO %[1]s;`
const runtimeResourceGrants = runtimeFenceGrants + `
	GRANT SELECT, INSERT, UPDATE ON leasefence.report_part TO %[1]s;`

// runtimeFenceGrants are the grants a Fence needs: no report_part, which
// only Resource writes.
const runtimeFenceGrants = `
	GRANT USAGE ON SCHEMA leasefence TO %[1]s;
	GRANT SELECT, INSERT, UPDATE ON leasefence.fence_floor TO %[1]s;
	GRANT SELECT, INSERT, DELETE ON leasefence.write_attempt TO %[1]s;`

// TestConfigErrorsAtConnect: a DSN the server refuses — an unknown
// database, an unknown role, a wrong password — makes Preflight and the
// first acquire fail with an error wrapping ErrConfig (not ErrUnavailable:
// the SQLSTATE in pgx's *pgconn.ConnectError wins) that says what to check.
func TestConfigErrorsAtConnect(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		role := "lf_password_" + driver
		requirePassword(t, f, role, "right")
		for _, tc := range []struct {
			name  string
			dsn   string
			words []string
		}{
			{"unknown database", withUser(t, f.leaseDSN, "", "", "no_such_db"),
				[]string{`database "no_such_db" does not exist`, "check the database name in the DSN", "3D000"}},
			{"unknown role", withUser(t, f.leaseDSN, "no_such_role", "", ""),
				[]string{`role "no_such_role" does not exist`, "check the user name in the DSN", "LOGIN", "pg_hba.conf", "28000"}},
			{"wrong password", withUser(t, f.leaseDSN, role, "wrong", ""),
				[]string{"password authentication failed", "check the password in the DSN", "28P01"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := lazyPool(t, driver, tc.dsn)
				leases, err := p.LeaseStore()
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				err = leases.Preflight(ctx)
				wantErr(t, err, leasecore.ErrConfig, append(tc.words, "fencepg: preflight: ")...)
				t.Logf("%s: %v", driver, err)
				_, err = leases.Acquire(ctx, "n", "h", time.Minute)
				wantErr(t, err, leasecore.ErrConfig, append(tc.words, "fencepg: acquire: ")...)
			})
		}
		t.Run("right password", func(t *testing.T) {
			leases, err := lazyPool(t, driver, withUser(t, f.leaseDSN, role, "right", "")).LeaseStore()
			if err != nil {
				t.Fatal(err)
			}
			if err := leases.Preflight(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// requirePassword makes the server ask role for its password (SCRAM) on
// loopback TCP connections, which the throwaway cluster otherwise trusts:
// it puts two lines for role alone before the cluster's pg_hba.conf,
// written by the server itself (lo_export, as the superuser) so that it
// needs no access to the data directory, and reloads. Every other role
// keeps its trust. The file is restored when the test ends.
func requirePassword(t *testing.T, f *fixture, role, password string) {
	t.Helper()
	if pgtest.Cluster(t).External() {
		t.Skip("needs pg_hba.conf of a cluster pgtemp started; LEASEFENCE_PG_URL names an external server")
	}
	ctx := context.Background()
	createRole(t, f.leaseDB, role, fmt.Sprintf(`
		SET password_encryption = 'scram-sha-256';
		ALTER ROLE %%[1]s PASSWORD '%s';`, password)+runtimeGrants)
	su, err := pgx.Connect(ctx, f.leaseDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	var path, original string
	if err := su.QueryRow(ctx, `SELECT current_setting('hba_file'), pg_read_file(current_setting('hba_file'))`).Scan(&path, &original); err != nil {
		t.Fatal(err)
	}
	lines := fmt.Sprintf("host all %[1]s 127.0.0.1/32 scram-sha-256\nhost all %[1]s ::1/128 scram-sha-256\n", role)
	if err := writeServerFile(ctx, su, path, lines+original); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), f.leaseDSN)
		if err == nil {
			defer c.Close(context.Background())
			err = writeServerFile(context.Background(), c, path, original)
		}
		if err != nil {
			t.Errorf("restore %s: %v", path, err)
		}
	})
	// The postmaster reloads asynchronously: wait until a wrong password
	// is refused.
	wrong := withUser(t, f.leaseDSN, role, "wrong-"+password, "")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := pgx.Connect(ctx, wrong)
		if err == nil {
			c.Close(ctx)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "28P01" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server still lets %s in with a wrong password after the reload: %v", role, err)
		}
	}
}

// writeServerFile has the server write content to path (a large object
// exported and dropped; superuser only) and reload its configuration.
func writeServerFile(ctx context.Context, su *pgx.Conn, path, content string) error {
	var oid uint32
	if err := su.QueryRow(ctx, `SELECT lo_from_bytea(0, convert_to($1::text, 'UTF8'))`, content).Scan(&oid); err != nil {
		return err
	}
	_, err := su.Exec(ctx, `SELECT lo_export($1::oid, $2::text)`, oid, path)
	_, err2 := su.Exec(ctx, `SELECT lo_unlink($1::oid)`, oid)
	_, err3 := su.Exec(ctx, `SELECT pg_reload_conf()`)
	return errors.Join(err, err2, err3)
}

// TestPermissionDenied: a role without the documented grants gets an
// error wrapping ErrConfig that names the missing grant, from the first
// statement (MapError: "to this role", on the default schema) and, with
// the role's name and every grant it lacks, from Preflight. A campaign
// returns it instead of retrying. With all the grants Preflight passes; a
// Fence needs none on report_part, the part store's table.
func TestPermissionDenied(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		noGrant, usageOnly, granted := "lf_nogrant_"+driver, "lf_usage_"+driver, "lf_granted_"+driver
		fenceOnly := "lf_fenceonly_" + driver
		for _, db := range []interface {
			Exec(context.Context, string, ...any) (int64, error)
		}{f.leaseDB, f.resourceDB} {
			createRole(t, db, noGrant, "")
			createRole(t, db, usageOnly, "GRANT USAGE ON SCHEMA leasefence TO %[1]s;")
		}
		createRole(t, f.leaseDB, granted, runtimeGrants)
		createRole(t, f.resourceDB, granted, runtimeResourceGrants)
		createRole(t, f.leaseDB, fenceOnly, runtimeGrants)
		createRole(t, f.resourceDB, fenceOnly, runtimeFenceGrants)
		open := func(t *testing.T, role string) (*fencepg.LeaseStore, *fencepg.Resource, pgopen.Fence) {
			lp := pgtest.Open(t, driver, withUser(t, f.leaseDSN, role, "", ""), 2)
			rp := pgtest.Open(t, driver, withUser(t, f.resDSN, role, "", ""), 2)
			leases, err := lp.LeaseStore()
			if err != nil {
				t.Fatal(err)
			}
			res, err := rp.Resource()
			if err != nil {
				t.Fatal(err)
			}
			return leases, res, openFence(t, rp)
		}

		t.Run("no grant", func(t *testing.T) {
			leases, res, fence := open(t, noGrant)
			_, err := leases.Acquire(ctx, "n", "h", time.Minute)
			wantErr(t, err, leasecore.ErrConfig, "fencepg: acquire: ", "permission denied for schema leasefence",
				"GRANT USAGE ON SCHEMA leasefence TO this role", "42501")
			t.Logf("%s acquire: %v", driver, err)
			err = leases.Preflight(ctx)
			wantErr(t, err, leasecore.ErrConfig, "fencepg: preflight: ", "role "+noGrant+" lacks privileges",
				"GRANT USAGE ON SCHEMA leasefence TO "+noGrant+"; GRANT SELECT, INSERT, UPDATE ON leasefence.lease TO "+noGrant)
			t.Logf("%s preflight: %v", driver, err)
			err = res.Preflight(ctx)
			wantErr(t, err, leasecore.ErrConfig, "GRANT USAGE ON SCHEMA leasefence TO "+noGrant,
				"GRANT SELECT, INSERT, UPDATE ON leasefence.fence_floor TO "+noGrant,
				"GRANT SELECT, INSERT ON leasefence.write_attempt TO "+noGrant,
				"GRANT SELECT, INSERT, UPDATE ON leasefence.report_part TO "+noGrant)
			err = fence.Preflight(ctx)
			wantErr(t, err, leasecore.ErrConfig, "GRANT SELECT, INSERT ON leasefence.write_attempt TO "+noGrant)
			if strings.Contains(err.Error(), "report_part") {
				t.Errorf("Fence.Preflight asks for report_part, which only Resource uses: %v", err)
			}

			// A campaign cannot heal this by retrying: it returns at once.
			retried := false
			err = leasecore.Campaign(ctx, leases, "n", "h", func(context.Context, leasecore.Grant) error { return nil },
				leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) {
					retried = retried || ev.Kind == leasecore.CampaignRetry
				}))
			wantErr(t, err, leasecore.ErrConfig, "GRANT USAGE ON SCHEMA leasefence TO this role")
			if retried {
				t.Error("the campaign retried a configuration error")
			}
		})

		t.Run("usage only", func(t *testing.T) {
			leases, res, fence := open(t, usageOnly)
			_, err := leases.Acquire(ctx, "n", "h", time.Minute)
			wantErr(t, err, leasecore.ErrConfig, "fencepg: acquire: ", "permission denied for table lease",
				"GRANT SELECT, INSERT, UPDATE ON leasefence.lease TO this role", "WithSchema")
			t.Logf("%s acquire: %v", driver, err)
			_, err = res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "h", Token: 1})
			wantErr(t, err, leasecore.ErrConfig, "fencepg: write: ", "permission denied for table",
				"ON leasefence.", "TO this role")
			t.Logf("%s write: %v", driver, err)
			_, err = fence.Advance(ctx, leasecore.Claim{Scope: "s", Writer: "h", Token: 1})
			wantErr(t, err, leasecore.ErrConfig, "permission denied for table fence_floor",
				"GRANT SELECT, INSERT, UPDATE ON leasefence.fence_floor TO this role")
			err = leases.Preflight(ctx)
			wantErr(t, err, leasecore.ErrConfig, "GRANT SELECT, INSERT, UPDATE ON leasefence.lease TO "+usageOnly)
			if strings.Contains(err.Error(), "USAGE") {
				t.Errorf("Preflight asks for USAGE, which the role has: %v", err)
			}
		})

		t.Run("granted", func(t *testing.T) {
			leases, res, fence := open(t, granted)
			for what, err := range map[string]error{
				"lease store": leases.Preflight(ctx), "resource": res.Preflight(ctx), "fence": fence.Preflight(ctx),
			} {
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
			}
		})

		t.Run("fence grants only", func(t *testing.T) {
			_, res, fence := open(t, fenceOnly)
			if err := fence.Preflight(ctx); err != nil {
				t.Errorf("fence: %v", err)
			}
			c := leasecore.Claim{Scope: "fence-only", Writer: "h", Token: 1}
			if r, err := fence.Advance(ctx, c); err != nil || !r.Accepted {
				t.Errorf("advance: %+v %v", r, err)
			}
			if r, err := fencedWrite(ctx, fence, c); err != nil || !r.Accepted {
				t.Errorf("fenced transaction: %+v %v", r, err)
			}
			stale := leasecore.Claim{Scope: c.Scope, Writer: "old", Token: 1}
			if r, err := fence.Advance(ctx, leasecore.Claim{Scope: c.Scope, Writer: "new", Token: 2}); err != nil || !r.Accepted {
				t.Errorf("advance of a newer holder: %+v %v", r, err)
			}
			if r, err := fencedWrite(ctx, fence, stale); err != nil || r.Accepted {
				t.Errorf("stale fenced transaction: %+v %v, want a logged rejection", r, err)
			}
			err := res.Preflight(ctx)
			wantErr(t, err, leasecore.ErrConfig, "GRANT SELECT, INSERT, UPDATE ON leasefence.report_part TO "+fenceOnly)
		})
	})
}

// TestPreparedStatementCollision: prepared statements that are not pgx's
// own — what pgx's default exec mode meets behind PgBouncer in transaction
// mode, where each transaction may get another server connection — come
// back from the server as 42P05 (a statement of pgx's cache name already
// exists) or 26000 (pgx's statement is gone) and map to ErrConfig naming
// default_query_exec_mode. Reproduced on one connection without PgBouncer:
// a PREPARE of the name pgx will use, and a DEALLOCATE ALL behind pgx's
// back. lib/pq prepares unnamed statements only; a duplicate PREPARE of its
// own shows that its 42P05 maps the same way.
func TestPreparedStatementCollision(t *testing.T) {
	ctx := context.Background()
	words := []string{"default_query_exec_mode=exec", "simple_protocol", "PgBouncer in transaction mode",
		"DefaultQueryExecMode"}
	t.Run("pgx duplicate", func(t *testing.T) {
		f := newFixture(t, pgopen.Pgx)
		p := pgtest.Open(t, pgopen.Pgx, f.leaseDSN, 1) // one connection: the one we prepare on
		leases, err := p.LeaseStore()
		if err != nil {
			t.Fatal(err)
		}
		digest := sha256.Sum256([]byte(pgstore.PreflightServer))
		name := "stmtcache_" + hex.EncodeToString(digest[:24]) // pgx's internal/stmtcache.StatementName
		if _, err := p.Pgx.Exec(ctx, "PREPARE "+name+" AS SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
		err = leases.Preflight(ctx)
		wantErr(t, err, leasecore.ErrConfig, append(words, "fencepg: preflight: ", `prepared statement "`+name+`" already exists`, "42P05")...)
		t.Logf("pgx: %v", err)
	})
	t.Run("pgx gone", func(t *testing.T) {
		f := newFixture(t, pgopen.Pgx)
		p := pgtest.Open(t, pgopen.Pgx, f.leaseDSN, 1)
		leases, err := p.LeaseStore()
		if err != nil {
			t.Fatal(err)
		}
		if err := leases.Preflight(ctx); err != nil { // prepares and caches its statements
			t.Fatal(err)
		}
		if _, err := p.Pgx.Exec(ctx, "DEALLOCATE ALL", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
		err = leases.Preflight(ctx)
		wantErr(t, err, leasecore.ErrConfig, append(words, "fencepg: preflight: ", "does not exist", "26000")...)
		t.Logf("pgx: %v", err)
	})
	t.Run("lib/pq duplicate", func(t *testing.T) {
		f := newFixture(t, pgopen.Libpq)
		p := pgtest.Open(t, pgopen.Libpq, f.leaseDSN, 1)
		conn, err := p.SQL.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for range 2 {
			_, err = conn.ExecContext(ctx, "PREPARE lf_dup AS SELECT 1")
		}
		got := pgstore.MapError(ctx, "fencepg", "acquire", err)
		wantErr(t, got, leasecore.ErrConfig, append(words, `prepared statement "lf_dup" already exists`)...)
	})
}

// TestServerTimeouts: the server's own statement_timeout and lock_timeout
// (set for the role here; a database or the server would do the same) end
// an acquire that waits for a row lock. Both wrap ErrUnavailable — not the
// caller's context.Canceled: ctx is still live — and name the setting.
func TestServerTimeouts(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		for _, tc := range []struct {
			setting string
			words   []string
		}{
			{"statement_timeout", []string{"statement_timeout", "canceling statement due to statement timeout", "57014"}},
			{"lock_timeout", []string{"lock_timeout", "canceling statement due to lock timeout", "55P03"}},
		} {
			t.Run(tc.setting, func(t *testing.T) {
				role := "lf_" + tc.setting + "_" + driver
				createRole(t, f.leaseDB, role, runtimeGrants+"ALTER ROLE %[1]s SET "+tc.setting+" = '200ms';")
				leases, err := pgtest.Open(t, driver, withUser(t, f.leaseDSN, role, "", ""), 1).LeaseStore()
				if err != nil {
					t.Fatal(err)
				}
				name := "timeout " + tc.setting
				if _, err := f.leases.Acquire(ctx, name, "holder", 10*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				tx, err := f.leaseDB.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				if _, err := tx.Exec(ctx, `SELECT FROM leasefence.lease WHERE name = $1 FOR UPDATE`, name); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				_, err = leases.Acquire(ctx, name, "waiter", time.Minute)
				wantErr(t, err, leasecore.ErrUnavailable, append(tc.words, "fencepg: acquire: ")...)
				if ctx.Err() != nil || time.Since(start) > 20*time.Second {
					t.Errorf("the acquire ended after %v, ctx %v", time.Since(start), ctx.Err())
				}
				t.Logf("%s: %v", driver, err)
			})
		}
	})
}

// TestPreflightRefusesFsyncOff: on a cluster started with fsync = off,
// every store's Preflight refuses with ErrNotDurable, which wraps
// ErrConfig, and says why and how to fix it.
func TestPreflightRefusesFsyncOff(t *testing.T) {
	if os.Getenv("LEASEFENCE_PG_URL") != "" {
		t.Skip("needs a cluster pgtemp starts (WithSetting); LEASEFENCE_PG_URL names an external server")
	}
	cluster := pgtemp.StartTB(t, pgtemp.WithSetting("fsync", "off"))
	ctx := context.Background()
	if err := cluster.CreateDatabase(ctx, "fsync_off"); err != nil {
		t.Fatal(err)
	}
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		p := pgtest.Open(t, driver, cluster.DSN("fsync_off"), 2)
		leases, res := openStores(t, p)
		fence := openFence(t, p)
		if err := errors.Join(leases.Migrate(ctx), res.Migrate(ctx)); err != nil {
			t.Fatal(err) // Migrate does not check durability: only Preflight refuses
		}
		for what, err := range map[string]error{
			"lease store": leases.Preflight(ctx), "resource": res.Preflight(ctx), "fence": fence.Preflight(ctx),
		} {
			if !errors.Is(err, fencepg.ErrNotDurable) {
				t.Errorf("%s: got %v, want ErrNotDurable", what, err)
			}
			wantErr(t, err, leasecore.ErrConfig, "fencepg: preflight: ", "fsync = off", "ALTER SYSTEM SET fsync = on",
				"hand it out again", "floor could go back")
		}
		t.Logf("%s: %v", driver, leases.Preflight(ctx))
	})
}

// TestPreflightNotMigrated: on a database nobody migrated, Preflight
// passes its connection, durability and grant checks and reports the
// missing tables as ErrSchema (run Migrate), not as a missing grant.
func TestPreflightNotMigrated(t *testing.T) {
	dsn := pgtest.CreateDB(t, "unmigrated")
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		p := pgtest.Open(t, driver, dsn, 1)
		leases, res := openStores(t, p)
		ctx := context.Background()
		wantErr(t, leases.Preflight(ctx), leasecore.ErrSchema, "fencepg: check schema: ", "leasefence.lease is missing", "run Migrate")
		wantErr(t, res.Preflight(ctx), leasecore.ErrSchema, "leasefence.fence_floor is missing", "run Migrate")
	})
}
