package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// securityDoc holds the SQL docs/security.md tells an operator to run; the
// tests below run exactly those blocks, read from the file, so the page
// and the tests cannot drift apart.
const securityDoc = "../../docs/security.md"

// sslCluster is a cluster of its own with SSL on (a server certificate
// made at run time, whose only name is the IP address 127.0.0.1), TCP
// without SSL refused, and passwords required of every role but the
// superuser; db is a database on it with the roles and grants of
// docs/security.md: leasefence_owner migrated the schema, leasefence_app
// got the runtime grants.
type sslCluster struct {
	cluster *pgtemp.Cluster
	caFile  string // the CA that signed the server's certificate
	db      string
}

const ownerPassword, appPassword = "owner-secret", "app-secret"

// startSSLCluster starts the cluster and prepares db as docs/security.md
// says: the setup block as the superuser, Migrate as leasefence_owner
// (over verify-full), the grant blocks as leasefence_owner, and the job's
// own table, which leasefence_owner creates in a schema of its own and
// grants to leasefence_app. It skips when the provider cannot run SSL
// (LEASEFENCE_PG_URL, LEASEFENCE_PG_DOCKER).
func startSSLCluster(t *testing.T) *sslCluster {
	t.Helper()
	ctx := context.Background()
	ca := backendtest.NewPKI(t, "postgres")
	certFile, keyFile := ca.Issue(t, "server", "postgres-server", net.ParseIP("127.0.0.1"))
	c, err := pgtemp.Start(ctx, pgtemp.WithSSL(certFile, keyFile), pgtemp.WithPasswordAuth())
	if errors.Is(err, pgtemp.ErrNotSupported) {
		t.Skipf("SSL needs a cluster pgtemp starts locally: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop the SSL cluster: %v", err)
		}
	})
	s := &sslCluster{cluster: c, caFile: ca.CAFile, db: "app"}
	if err := c.CreateDatabase(ctx, s.db); err != nil {
		t.Fatal(err)
	}
	su := connect(t, c.DSN(s.db)) // the superuser, sslmode=require
	execScript(t, su, docSQL(t, "pg-setup", map[string]string{
		":'owner_password'": quoteLiteral(ownerPassword),
		":'app_password'":   quoteLiteral(appPassword),
		`:"DBNAME"`:         pgx.Identifier{s.db}.Sanitize(),
	}))

	// The owner migrates, then grants, as the page says.
	ownerDSN := s.dsn("leasefence_owner", ownerPassword, nil)
	owner := pgtest.Open(t, pgopen.Pgx, ownerDSN, 2)
	leases, _ := openStores(t, owner)
	if err := errors.Join(leases.Migrate(ctx), openFence(t, owner).Migrate(ctx)); err != nil {
		t.Fatalf("Migrate as leasefence_owner: %v", err)
	}
	ownerConn := connect(t, ownerDSN)
	execScript(t, ownerConn, docSQL(t, "pg-grants", nil))
	execScript(t, ownerConn, docSQL(t, "pg-grants-optional", nil))
	execScript(t, ownerConn, `
		CREATE SCHEMA jobs;
		CREATE TABLE jobs.job_run (scope text PRIMARY KEY, result text NOT NULL);
		GRANT USAGE ON SCHEMA jobs TO leasefence_app;
		GRANT SELECT, INSERT, UPDATE ON jobs.job_run TO leasefence_app;`)
	return s
}

// dsn is a URL for user on the cluster's database with sslmode=verify-full
// and the CA as sslrootcert, host 127.0.0.1, changed by edit (if not nil).
func (s *sslCluster) dsn(user, password string, edit func(u *url.URL, q url.Values)) string {
	u := &url.URL{
		Scheme: "postgres",
		User:   url.UserPassword(user, password),
		Host:   net.JoinHostPort(s.cluster.Host(), strconv.Itoa(s.cluster.Port())),
		Path:   "/" + s.db,
	}
	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {s.caFile}}
	if edit != nil {
		edit(u, q)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// TestSSLVerifyFull: both drivers connect with sslmode=verify-full to
// 127.0.0.1 through a certificate that names that address only (an IP
// SAN), over SSL; and refuse, or are refused, with an error that says
// why: another host name than the certificate's, a server certificate from
// another CA, no SSL, a wrong password.
func TestSSLVerifyFull(t *testing.T) {
	s := startSSLCluster(t)
	ctx := context.Background()
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		p := pgtest.Open(t, driver, s.dsn("leasefence_app", appPassword, nil), 1)
		var ssl bool
		var version string
		if err := pgtest.DB(p).QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version); err != nil || !ssl {
			t.Fatalf("pg_stat_ssl: ssl %t (%s), %v", ssl, version, err)
		}
		t.Logf("verify-full to 127.0.0.1: connected over %s", version)

		otherCA := backendtest.NewPKI(t, "other")
		for _, tc := range []struct {
			name  string
			edit  func(u *url.URL, q url.Values)
			words []string
		}{
			{"host name not in the certificate", func(u *url.URL, q url.Values) {
				u.Host = net.JoinHostPort("localhost", u.Port())
			}, []string{"x509: certificate is not valid for any names, but wanted to match localhost"}},
			{"server certificate from another CA", func(u *url.URL, q url.Values) {
				q.Set("sslrootcert", otherCA.CAFile)
			}, []string{"certificate signed by unknown authority"}},
			{"no SSL", func(u *url.URL, q url.Values) {
				q.Set("sslmode", "disable")
			}, []string{"pg_hba.conf", "no encryption"}},
			{"wrong password", func(u *url.URL, q url.Values) {
				u.User = url.UserPassword("leasefence_app", "wrong")
			}, []string{"password authentication failed"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dsn := s.dsn("leasefence_app", appPassword, tc.edit)
				_, err := pgopen.Open(ctx, driver, dsn, 1)
				if err == nil {
					t.Fatalf("%s: connected, want a refusal", dsn)
				}
				t.Log(err)
				for _, w := range tc.words {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
			})
		}
	})
}

// TestLeastPrivilegeRuntimeRole: with only the grants of docs/security.md,
// over verify-full, the runtime role leasefence_app passes Preflight (of
// the lease store, the fence, a store with holder sessions and the outbox,
// whose grants the page's optional block gives) and runs a job end to end
// on both drivers: acquire, a fenced transaction of its own table, renew,
// release; the next holder advances and the first one's late transaction
// is rejected. Then, as that
// role, every way to send tokens backwards or to switch the guards off
// that SQL offers is refused, each with the error that refuses it: the
// guard trigger's (LF002) for lowering a floor or a lease's token through
// the UPDATE the role holds, a permission error (42501) for the rest. The
// floor and the token are unchanged after all of them.
func TestLeastPrivilegeRuntimeRole(t *testing.T) {
	s := startSSLCluster(t)
	ctx := context.Background()
	dsn := s.dsn("leasefence_app", appPassword, nil)

	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		p := pgtest.Open(t, driver, dsn, 2)
		leases, _ := openStores(t, p)
		fence := openFence(t, p)
		// The optional block's grants: holder sessions and the outbox.
		sessions, _ := openStores(t, p, fencepg.WithSharedLeases())
		outbox, err := p.Outbox()
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(leases.Preflight(ctx), fence.Preflight(ctx), sessions.Preflight(ctx), outbox.Preflight(ctx)); err != nil {
			t.Fatalf("Preflight as leasefence_app: %v", err)
		}
		scope := "nightly-" + driver
		if g, err := sessions.Acquire(ctx, "session-"+driver, "host-1", time.Minute); err != nil {
			t.Fatalf("acquire with holder sessions: %v", err)
		} else if err := sessions.Release(ctx, g); err != nil {
			t.Fatalf("release with holder sessions: %v", err)
		}
		g, err := leases.Acquire(ctx, scope, "host-1", time.Minute)
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		write := func(c leasecore.Claim, result string) (leasecore.Result, error) {
			const upsert = `INSERT INTO jobs.job_run VALUES ($1, $2) ON CONFLICT (scope) DO UPDATE SET result = EXCLUDED.result`
			if p.Pgx != nil {
				return fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, upsert, c.Scope, result)
					return err
				})
			}
			return fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, upsert, c.Scope, result)
				return err
			})
		}
		if r, err := write(g.Claim(scope), "done by host-1"); err != nil || !r.Accepted {
			t.Fatalf("fenced transaction: %+v %v", r, err)
		}
		if g, err = leases.Renew(ctx, g); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if err := leases.Release(ctx, g); err != nil {
			t.Fatalf("release: %v", err)
		}
		// The next holder fences the first off; the first's late write is
		// rejected.
		next, err := leases.Acquire(ctx, scope, "host-2", time.Minute)
		if err != nil {
			t.Fatalf("acquire by the next holder: %v", err)
		}
		if r, err := fence.Advance(ctx, next.Claim(scope)); err != nil || !r.Accepted {
			t.Fatalf("advance: %+v %v", r, err)
		}
		if r, err := write(g.Claim(scope), "stale"); err != nil || r.Accepted || r.Floor != next.Token {
			t.Fatalf("the first holder's late fenced transaction: %+v %v, want a rejection by floor %d", r, err, next.Token)
		}
		if err := leases.Release(ctx, next); err != nil {
			t.Fatalf("release: %v", err)
		}
		var result string
		if err := pgtest.DB(p).QueryRow(ctx, `SELECT result FROM jobs.job_run WHERE scope = $1`, scope).Scan(&result); err != nil || result != "done by host-1" {
			t.Fatalf("the job's row: %q %v", result, err)
		}
	})

	// The refusals, on the state the pgx run left: scope nightly-pgx has a
	// floor and a lease row, both at token 2 or more.
	app := connect(t, dsn)
	const scope = "nightly-pgx"
	state := func() (floor, token int64) {
		t.Helper()
		if err := app.QueryRow(ctx, `SELECT (SELECT max_token FROM leasefence.fence_floor WHERE scope = $1),
			(SELECT token FROM leasefence.lease WHERE name = $1)`, scope).Scan(&floor, &token); err != nil {
			t.Fatal(err)
		}
		return floor, token
	}
	floor, token := state()
	if floor < 2 || token < 2 {
		t.Fatalf("floor %d, token %d: want both at 2 or more after the run above", floor, token)
	}
	for _, tc := range []struct {
		name, sql, code, words string
	}{
		{"lower a floor", `UPDATE leasefence.fence_floor SET max_token = max_token - 1 WHERE scope = 'nightly-pgx'`,
			"LF002", "UPDATE on leasefence.fence_floor refused"},
		{"lower a floor by upsert", `INSERT INTO leasefence.fence_floor VALUES ('nightly-pgx', 0) ON CONFLICT (scope) DO UPDATE SET max_token = EXCLUDED.max_token`,
			"LF002", "UPDATE on leasefence.fence_floor refused"},
		{"reset a lease's token", `UPDATE leasefence.lease SET token = token - 1 WHERE name = 'nightly-pgx'`,
			"LF002", "UPDATE on leasefence.lease refused"},
		{"delete a floor", `DELETE FROM leasefence.fence_floor`, "42501", "permission denied for table fence_floor"},
		{"delete a lease", `DELETE FROM leasefence.lease`, "42501", "permission denied for table lease"},
		{"truncate the floors", `TRUNCATE leasefence.fence_floor`, "42501", "permission denied for table fence_floor"},
		{"truncate the leases", `TRUNCATE leasefence.lease`, "42501", "permission denied for table lease"},
		{"disable a guard trigger", `ALTER TABLE leasefence.fence_floor DISABLE TRIGGER floor_only_grows`, "42501", "must be owner of table fence_floor"},
		{"disable every trigger", `ALTER TABLE leasefence.lease DISABLE TRIGGER ALL`, "42501", "must be owner of table lease"},
		{"drop a guard trigger", `DROP TRIGGER lease_token_only_grows ON leasefence.lease`, "42501", "must be owner of relation lease"},
		{"replace the guard function", `CREATE OR REPLACE FUNCTION leasefence.refuse_token_reset() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$`,
			"42501", "permission denied for schema leasefence"},
		{"skip triggers as a replica", `SET session_replication_role = replica`, "42501", `permission denied to set parameter "session_replication_role"`},
		{"drop the floors", `DROP TABLE leasefence.fence_floor`, "42501", "must be owner of table fence_floor"},
		{"create a table of the schema", `CREATE TABLE leasefence.fence_floor_copy (scope text)`, "42501", "permission denied for schema leasefence"},
		{"reset the attempt log's sequence", `SELECT setval(pg_get_serial_sequence('leasefence.write_attempt', 'id'), 1)`,
			"42501", "permission denied for sequence write_attempt_id_seq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := app.Exec(ctx, tc.sql)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != tc.code || !strings.Contains(pe.Message, tc.words) {
				t.Fatalf("%s\n  got %v, want SQLSTATE %s %q", tc.sql, err, tc.code, tc.words)
			}
			t.Logf("%s: %s", pe.Code, pe.Message)
		})
	}
	if f, k := state(); f != floor || k != token {
		t.Fatalf("after the refusals: floor %d, token %d; want %d, %d unchanged", f, k, floor, token)
	}

	// The schema's administrative path (a transaction that sets
	// leasefence_admin.allow_token_reset) passes only for a role with the
	// privileges of the table's owner: a custom setting is anyone's to set,
	// and the runtime role setting it is refused like the others.
	t.Run("administrative path", func(t *testing.T) {
		_, err := app.Exec(ctx, `BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on;
			UPDATE leasefence.fence_floor SET max_token = max_token - 1 WHERE scope = 'nightly-pgx'; COMMIT`)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "LF002" {
			t.Fatalf("the runtime role's reset through the administrative path: %v; want LF002", err)
		}
		_, _ = app.Exec(ctx, "ROLLBACK")
		if f, k := state(); f != floor || k != token {
			t.Fatalf("after the refusal: floor %d, token %d; want %d, %d unchanged", f, k, floor, token)
		}
		t.Logf("%s: %s", pe.Code, pe.Message)
	})
}

// docSQL returns the SQL block of docs/security.md after the marker
// <!-- security-test:NAME -->, with each psql variable of vars replaced.
func docSQL(t *testing.T, name string, vars map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(securityDoc)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?s)<!-- security-test:` + regexp.QuoteMeta(name) + ` -->\n` + "```sql\n(.*?)```")
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no sql block after <!-- security-test:%s -->", securityDoc, name)
	}
	sqlText := string(m[1])
	for k, v := range vars {
		if !strings.Contains(sqlText, k) {
			t.Fatalf("%s: block %s lacks the variable %s", securityDoc, name, k)
		}
		sqlText = strings.ReplaceAll(sqlText, k, v)
	}
	if strings.Contains(sqlText, ":'") || strings.Contains(sqlText, `:"`) {
		t.Fatalf("%s: block %s has a psql variable the test does not set:\n%s", securityDoc, name, sqlText)
	}
	return sqlText
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// connect opens one pgx connection, closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// execScript runs a script (several statements: the simple protocol).
func execScript(t *testing.T, conn *pgx.Conn, script string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), script); err != nil {
		t.Fatalf("%v\n%s", err, script)
	}
}
