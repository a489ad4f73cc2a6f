package command_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/cli/internal/command"
	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// runEnv runs the command in-process with env as its whole environment.
func runEnv(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := command.Run(context.Background(), args, command.Env{
		Stdout: &out, Stderr: &errOut,
		Getenv:   func(k string) string { return env[k] },
		Hostname: func() (string, error) { return "testhost", nil },
	})
	return result{code, out.String(), errOut.String()}
}

// TestTLSUsageErrors: the etcd TLS and user flags and their ETCDCTL_*
// variables, badly combined, are usage errors (exit 2) that name the flag
// or variable, before anything is sent (the endpoint points nowhere).
func TestTLSUsageErrors(t *testing.T) {
	dir := t.TempDir()
	pki := backendtest.NewPKI(t, "usage")
	cert, key := pki.Issue(t, "client", "ops")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ep := []string{"status", "--endpoints", "127.0.0.1:1"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, append(ep, "--cert", cert), "--cert given without --key (or ETCDCTL_KEY)"},
		{nil, append(ep, "--key", key), "--key given without --cert (or ETCDCTL_CERT)"},
		{nil, append(ep, "--password", "pw"), "--password given without --user (or ETCDCTL_USER)"},
		{nil, append(ep, "--user", "ops"), `--user "ops": no password: give --password (or ETCDCTL_PASSWORD), or NAME:PASSWORD`},
		{nil, append(ep, "--user", ":pw"), "--user: the user name and the password must not be empty"},
		{nil, append(ep, "--cacert", ""), "--cacert: must not be empty"},
		{nil, append(ep, "--cacert", filepath.Join(dir, "missing.pem")), "--cacert: open " + filepath.Join(dir, "missing.pem")},
		{nil, append(ep, "--cacert", notPEM), "--cacert " + notPEM + ": holds no PEM certificate"},
		{nil, append(ep, "--cert", notPEM, "--key", key), "--cert and --key: tls:"},
		{nil, []string{"status", "--endpoints", "http://127.0.0.1:1", "--cacert", pki.CAFile},
			"--cacert asks for TLS, but the endpoint http://127.0.0.1:1 is plain HTTP"},
		{nil, append(ep, "--insecure-skip-tls-verify", "--cacert", pki.CAFile),
			"--insecure-skip-tls-verify and --cacert: skipping the verification of the server ignores the CA"},
		{nil, []string{"status", "--backend", "postgres", "--cacert", pki.CAFile}, "etcd flags (--cacert) given, but --backend is postgres"},
		{nil, []string{"status", "--dsn", "postgres://x@127.0.0.1:1/db", "--user", "ops:pw"}, "both PostgreSQL flags (--dsn) and etcd flags (--user) given"},
		{map[string]string{"ETCDCTL_USER": "ops"}, ep, `ETCDCTL_USER "ops": no password`},
		{map[string]string{"ETCDCTL_CERT": cert}, ep, "ETCDCTL_CERT given without --key (or ETCDCTL_KEY)"},
		{map[string]string{"ETCDCTL_PASSWORD": "pw"}, ep, "ETCDCTL_PASSWORD given without --user"},
		{map[string]string{"ETCDCTL_INSECURE_SKIP_TLS_VERIFY": "maybe"}, ep, `ETCDCTL_INSECURE_SKIP_TLS_VERIFY="maybe": want true or false`},
		{map[string]string{"ETCDCTL_CACERT": notPEM}, ep, "ETCDCTL_CACERT " + notPEM + ": holds no PEM certificate"},
		// A flag wins over its variable: the bad variable is not read.
		{map[string]string{"ETCDCTL_CACERT": notPEM}, append(ep, "--cacert", filepath.Join(dir, "missing.pem")), "--cacert: open"},
		// PostgreSQL: the DSN's SSL parameters are checked as it is parsed.
		{nil, []string{"status", "--dsn", "postgres://x@127.0.0.1:1/db?sslmode=bogus"}, "status: --dsn:"},
		{nil, []string{"status", "--dsn", "host=127.0.0.1 port=1 sslmode=verify-full sslrootcert=" + filepath.Join(dir, "missing.pem")}, "status: --dsn:"},
	} {
		r := runEnv(t, tc.env, tc.args...)
		if r.code != command.ExitUsage || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("env %v, leasefence %q: want exit 2 and %q; got %s", tc.env, tc.args, tc.want, r)
		}
	}
}

// TestTLSAndAuth runs the command against an etcd that serves clients
// over TLS only, requires a client certificate (--client-cert-auth) and
// has authentication on, and against a PostgreSQL cluster with SSL on and
// passwords required, through the TLS flags, their ETCDCTL_* variables,
// and libpq DSNs (URL and key=value) with sslmode=verify-full to
// 127.0.0.1. The CA and the certificates are made at run time. Refusals
// exit 1 with what to check: a wrong password, a missing client
// certificate, a server certificate from another CA, a user whose role
// does not cover the prefix, a host name the certificate does not name.
func TestTLSAndAuth(t *testing.T) {
	pki := backendtest.NewPKI(t, "tls")
	loop := net.ParseIP("127.0.0.1")
	srvCert, srvKey := pki.Issue(t, "etcd-server", "etcd-server", loop)
	adminCert, adminKey := pki.Issue(t, "etcdtemp", "etcdtemp")
	opsCert, opsKey := pki.Issue(t, "ops", "leasefence-ops-client") // names no etcd user

	t.Run("etcd", func(t *testing.T) {
		const rootPassword, opsPassword = "root-secret", "ops-secret"
		srv := etcdtemp.StartTB(t,
			etcdtemp.WithClientTLS(etcdtemp.ClientTLS{
				CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: pki.CAFile, ClientCertAuth: true,
				ClientCertFile: adminCert, ClientKeyFile: adminKey,
			}),
			etcdtemp.WithAuth(rootPassword))
		ep := srv.Endpoints()[0]
		ctx := context.Background()
		// The application's side, as root: a held lease.
		tc := pki.ClientTLS(t, adminCert, adminKey)
		root, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), TLS: tc, Username: "root", Password: rootPassword,
			DialTimeout: 30 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		// The operator's user: read and write on the library's prefix.
		for _, step := range []func() error{
			func() error { _, err := root.RoleAdd(ctx, "leasefence-ops"); return err },
			func() error {
				_, err := root.RoleGrantPermission(ctx, "leasefence-ops", "/leasefence/", clientv3.GetPrefixRangeEnd("/leasefence/"),
					clientv3.PermissionType(clientv3.PermReadWrite))
				return err
			},
			func() error { _, err := root.UserAdd(ctx, "ops", opsPassword); return err },
			func() error { _, err := root.UserGrantRole(ctx, "ops", "leasefence-ops"); return err },
		} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
		leases, err := fenceetcd.NewLeaseStore(root)
		if err != nil {
			t.Fatal(err)
		}
		defer leases.Close()
		g, err := leases.Acquire(ctx, "nightly", "host-1", 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}

		flags := []string{"--endpoints", ep, "--cacert", pki.CAFile, "--cert", opsCert, "--key", opsKey, "--user", "ops", "--password", opsPassword}
		r := run(t, append([]string{"status", "nightly", "--json"}, flags...)...)
		var st statusDoc
		want(t, r, 0)
		decode(t, r, &st)
		if len(st.Leases) != 1 || st.Leases[0].Holder != "host-1" || st.Leases[0].Token != uint64(g.Token) {
			t.Fatalf("status over TLS with flags: %s", r)
		}
		env := map[string]string{
			"ETCDCTL_ENDPOINTS": ep, "ETCDCTL_CACERT": pki.CAFile, "ETCDCTL_CERT": opsCert, "ETCDCTL_KEY": opsKey,
			"ETCDCTL_USER": "ops", "ETCDCTL_PASSWORD": opsPassword,
		}
		tok := strconv.FormatUint(uint64(g.Token), 10)
		want(t, runEnv(t, env, "advance", "nightly", tok), 0, "nightly", tok)
		want(t, runEnv(t, env, "floors", "nightly"), 0, tok)
		// --user NAME:PASSWORD, as etcdctl takes it.
		want(t, run(t, "status", "nightly", "--endpoints", ep, "--cacert", pki.CAFile, "--cert", opsCert, "--key", opsKey,
			"--user", "ops:"+opsPassword), 0, "host-1")

		refused := func(t *testing.T, r result, words ...string) {
			t.Helper()
			want(t, r, command.ExitError, words...)
			t.Log(strings.TrimSpace(r.stderr))
		}
		t.Run("wrong password", func(t *testing.T) {
			bad := map[string]string{}
			for k, v := range env {
				bad[k] = v
			}
			bad["ETCDCTL_PASSWORD"] = "wrong"
			refused(t, runEnv(t, bad, "status", "nightly"), `logging in to etcd as "ops"`, "authentication failed")
		})
		t.Run("no client certificate", func(t *testing.T) {
			refused(t, run(t, "status", "nightly", "--endpoints", ep, "--cacert", pki.CAFile, "--user", "ops:"+opsPassword, "--timeout", "2s"),
				"certificate required", "check --cacert, --cert and --key")
		})
		t.Run("server certificate from another CA", func(t *testing.T) {
			other := backendtest.NewPKI(t, "other")
			refused(t, run(t, "status", "nightly", "--endpoints", ep, "--cacert", other.CAFile, "--cert", opsCert, "--key", opsKey,
				"--user", "ops:"+opsPassword, "--timeout", "2s"),
				"certificate signed by unknown authority", "check --cacert, --cert and --key")
		})
		t.Run("prefix the role does not cover", func(t *testing.T) {
			refused(t, run(t, append([]string{"status", "nightly", "--prefix", "/other"}, flags...)...),
				"permission denied", "etcdctl role grant-permission")
		})
	})

	t.Run("postgres", func(t *testing.T) {
		pgCert, pgKey := pki.Issue(t, "pg-server", "postgres-server", loop)
		ctx := context.Background()
		c, err := pgtemp.Start(ctx, pgtemp.WithSSL(pgCert, pgKey), pgtemp.WithPasswordAuth())
		if err != nil {
			if strings.Contains(err.Error(), "not supported") {
				t.Skipf("SSL needs a cluster pgtemp starts locally: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
		if err := c.CreateDatabase(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		su, err := pgx.Connect(ctx, c.DSN("app"))
		if err != nil {
			t.Fatal(err)
		}
		defer su.Close(ctx)
		const ownerPassword, appPassword = "owner secret", "app-secret" // a space, to be quoted in key=value
		if _, err := su.Exec(ctx, securityDocSQL(t, "pg-setup", map[string]string{
			":'owner_password'": quoteLiteral(ownerPassword), ":'app_password'": quoteLiteral(appPassword), `:"DBNAME"`: `"app"`,
		})); err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(c.Port())
		// The owner migrates through a URL...
		ownerURL := (&url.URL{Scheme: "postgres", User: url.UserPassword("leasefence_owner", ownerPassword),
			Host: net.JoinHostPort("127.0.0.1", port), Path: "/app",
			RawQuery: url.Values{"sslmode": {"verify-full"}, "sslrootcert": {pki.CAFile}}.Encode()}).String()
		want(t, run(t, "migrate", "--dsn", ownerURL), 0, "leasefence.lease ready")
		owner, err := pgx.Connect(ctx, ownerURL)
		if err != nil {
			t.Fatal(err)
		}
		defer owner.Close(ctx)
		if _, err := owner.Exec(ctx, securityDocSQL(t, "pg-grants", nil)); err != nil {
			t.Fatal(err)
		}
		// ...the operator works as a role with the runtime grants, through a
		// key=value DSN.
		kv := func(host, rootCert string) string {
			return fmt.Sprintf("host=%s port=%s dbname=app user=leasefence_app password='%s' sslmode=verify-full sslrootcert=%s",
				host, port, appPassword, rootCert)
		}
		dsn := kv("127.0.0.1", pki.CAFile)
		want(t, run(t, "status", "nightly", "--dsn", dsn), 0, "nightly")
		want(t, run(t, "advance", "nightly", "7", "--force", "--dsn", dsn), 0, "7")
		want(t, run(t, "floors", "--dsn", dsn), 0, "nightly", "7")

		refused := func(t *testing.T, r result, words ...string) {
			t.Helper()
			want(t, r, command.ExitError, words...)
			t.Log(strings.TrimSpace(r.stderr))
		}
		refused(t, run(t, "status", "--dsn", kv("localhost", pki.CAFile), "--timeout", "5s"), "wanted to match localhost")
		refused(t, run(t, "status", "--dsn", kv("127.0.0.1", backendtest.NewPKI(t, "other").CAFile), "--timeout", "5s"),
			"certificate signed by unknown authority")
		refused(t, run(t, "status", "--dsn", strings.Replace(dsn, "sslmode=verify-full", "sslmode=disable", 1), "--timeout", "5s"),
			"no encryption")
		// The runtime role cannot migrate: it has no CREATE anywhere.
		refused(t, run(t, "migrate", "--dsn", dsn), "permission denied")
	})
}

// securityDocSQL returns the SQL block of docs/security.md after
// <!-- security-test:NAME -->, with psql's variables replaced: the
// command's test runs the page's statements, like fence-pg's.
func securityDocSQL(t *testing.T, name string, vars map[string]string) string {
	t.Helper()
	b, err := os.ReadFile("../../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)<!-- security-test:` + regexp.QuoteMeta(name) + ` -->\n` + "```sql\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/security.md: no sql block after <!-- security-test:%s -->", name)
	}
	s := string(m[1])
	for k, v := range vars {
		s = strings.ReplaceAll(s, k, v)
	}
	return s
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
