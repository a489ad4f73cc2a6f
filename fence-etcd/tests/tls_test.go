package fenceetcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// TestTLSAndAuth runs the library through a client of an etcd that serves
// clients over TLS only, requires a client certificate signed by its CA
// (--client-cert-auth) and has authentication on, with the application's
// user holding a role that may read and write the library's key prefix and
// the application's own data prefix, nothing else (docs/security.md). The
// CA and every certificate are made here, at run time. A server of its
// own: authentication would lock every other test out of the shared one.
//
// Shown: acquire, advance, a fenced Txn of the application's own key,
// renew, release, through that client; refused: a client without a user
// (its certificate's Common Name names no etcd user) or with a wrong
// password, each with an error that says so; a client without a
// certificate, one that does not trust the server's CA, and plain HTTP,
// which clientv3 reports only as its deadline (the handshake names the
// cause); a certificate whose Common Name is the user logs in without a
// password; and the application's user cannot touch keys outside its
// prefixes, nor change users, roles or authentication.
func TestTLSAndAuth(t *testing.T) {
	pki := backendtest.NewPKI(t, "etcd")
	srvCert, srvKey := pki.Issue(t, "server", "etcd-server", net.ParseIP("127.0.0.1"))
	adminCert, adminKey := pki.Issue(t, "etcdtemp", "etcdtemp")
	appCert, appKey := pki.Issue(t, "app", "leasefence-client") // names no etcd user
	const rootPassword, appPassword = "root-secret", "app-secret"
	srv := etcdtemp.StartTB(t,
		etcdtemp.WithClientTLS(etcdtemp.ClientTLS{
			CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: pki.CAFile, ClientCertAuth: true,
			ClientCertFile: adminCert, ClientKeyFile: adminKey,
		}),
		etcdtemp.WithAuth(rootPassword))
	if ep := srv.Endpoints()[0]; !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoint %s, want https://127.0.0.1:PORT", ep)
	}
	ctx := context.Background()
	appTLS := pki.ClientTLS(t, appCert, appKey)

	// The application's user and role, as docs/security.md gives them:
	// etcdctl role add leasefence-app
	// etcdctl role grant-permission leasefence-app readwrite --prefix=true /leasefence/
	// etcdctl role grant-permission leasefence-app readwrite --prefix=true /jobs/
	// etcdctl user add leasefence-app; etcdctl user grant-role leasefence-app leasefence-app
	const user, role = "leasefence-app", "leasefence-app"
	root := dialTLS(t, srv.Endpoints(), appTLS, "root", rootPassword)
	for _, step := range []func() error{
		func() error { _, err := root.RoleAdd(ctx, role); return err },
		func() error { return grantPrefix(ctx, root, role, "/leasefence/") },
		func() error { return grantPrefix(ctx, root, role, "/jobs/") },
		func() error { _, err := root.UserAdd(ctx, user, appPassword); return err },
		func() error { _, err := root.UserGrantRole(ctx, user, role); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("end to end", func(t *testing.T) {
		cli := dialTLS(t, srv.Endpoints(), appTLS, user, appPassword)
		leases, err := fenceetcd.NewLeaseStore(cli) // the default prefix, /leasefence
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = leases.Close() })
		fence, err := fenceetcd.NewFence(cli, fenceetcd.WithAttemptLog(leasecore.LogAll))
		if err != nil {
			t.Fatal(err)
		}
		g, err := leases.Acquire(ctx, "nightly-report", "host-1", 10*time.Second)
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		c := g.Claim("nightly-report")
		if r, err := fence.Advance(ctx, c); err != nil || !r.Accepted {
			t.Fatalf("advance: %+v %v", r, err)
		}
		r, resp, err := fence.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut("/jobs/nightly-report/result", "done by host-1")}})
		if err != nil || !r.Accepted || !resp.Succeeded {
			t.Fatalf("fenced write: %+v %v", r, err)
		}
		if g, err = leases.Renew(ctx, g); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if st, err := leases.Inspect(ctx, "nightly-report"); err != nil || !st.Held || st.Holder != "host-1" {
			t.Fatalf("inspect: %+v %v", st, err)
		}
		if as, err := fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "nightly-report", Limit: 10}); err != nil || len(as) != 2 {
			t.Fatalf("attempts: %+v %v", as, err)
		}
		if err := leases.Release(ctx, g); err != nil {
			t.Fatalf("release: %v", err)
		}
		// A stale token is still turned away through this client.
		if r, _, err := fence.Commit(ctx, leasecore.Claim{Scope: "nightly-report", Writer: "old", Token: g.Token - 1, Space: g.Space},
			fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut("/jobs/nightly-report/result", "stale")}}); err != nil || r.Accepted {
			t.Fatalf("stale write: %+v %v, want a rejection", r, err)
		}
		got, err := cli.Get(ctx, "/jobs/nightly-report/result")
		if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "done by host-1" {
			t.Fatalf("the job's key: %v %v", got, err)
		}
	})

	// acquire tries an acquire through cli with a deadline of wait: a
	// client that cannot connect retries until then.
	acquire := func(t *testing.T, cli *clientv3.Client, wait time.Duration) error {
		t.Helper()
		leases, err := fenceetcd.NewLeaseStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		defer leases.Close()
		actx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err = leases.Acquire(actx, "refused", "host-2", 10*time.Second)
		if err == nil {
			t.Fatal("acquire succeeded, want a refusal")
		}
		return err
	}
	wantWords := func(t *testing.T, err error, words ...string) {
		t.Helper()
		t.Log(err)
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
	}

	t.Run("no user", func(t *testing.T) {
		// The certificate is valid, but its Common Name names no etcd
		// user and the client gives none.
		err := acquire(t, dialTLS(t, srv.Endpoints(), appTLS, "", ""), servedWait)
		if !errors.Is(err, leasecore.ErrConfig) {
			t.Errorf("got %v, want an error wrapping ErrConfig", err)
		}
		wantWords(t, err, "permission denied")
	})
	t.Run("wrong password", func(t *testing.T) {
		cli, err := newTLSClient(srv.Endpoints(), appTLS, user, "wrong", servedWait)
		if err == nil {
			t.Cleanup(func() { _ = cli.Close() })
			err = acquire(t, cli, servedWait)
		}
		wantWords(t, err, "authentication failed")
	})
	// A client whose TLS handshake fails: the server's refusal (a TLS
	// alert) or the client's (an unverifiable certificate) never reaches
	// the caller; clientv3 retries the connection until the deadline and
	// reports only that, from clientv3.New when it has a user to log in,
	// from the first request otherwise. The leasefence command names the
	// cause (cli: TestTLSAndAuth); here the handshake shows it.
	handshakeRefused := func(t *testing.T, endpoints []string, tc *tls.Config, cause string) {
		t.Helper()
		_, err := newTLSClient(endpoints, tc, user, appPassword, refusedWait)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("clientv3.New with a user: %v, want the dial deadline", err)
		}
		cli := dialTLS(t, endpoints, tc, "", "")
		if err := acquire(t, cli, refusedWait); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("acquire: %v, want the deadline", err)
		}
		if tc == nil {
			return
		}
		err = handshake(endpoints[0], tc)
		t.Logf("TLS handshake: %v", err)
		if err == nil || !strings.Contains(err.Error(), cause) {
			t.Errorf("TLS handshake: %v, want %q", err, cause)
		}
	}
	t.Run("no client certificate", func(t *testing.T) {
		noCert := appTLS.Clone()
		noCert.Certificates = nil
		handshakeRefused(t, srv.Endpoints(), noCert, "certificate required")
	})
	t.Run("server not trusted", func(t *testing.T) {
		other := backendtest.NewPKI(t, "other") // a CA the server's certificate does not chain to
		untrusting := appTLS.Clone()
		untrusting.RootCAs = other.Pool()
		handshakeRefused(t, srv.Endpoints(), untrusting, "certificate signed by unknown authority")
	})
	t.Run("plain HTTP", func(t *testing.T) {
		handshakeRefused(t, []string{strings.Replace(srv.Endpoints()[0], "https://", "http://", 1)}, nil, "")
	})
	t.Run("nothing acquired by the refused", func(t *testing.T) {
		leases, err := fenceetcd.NewLeaseStore(dialTLS(t, srv.Endpoints(), appTLS, user, appPassword))
		if err != nil {
			t.Fatal(err)
		}
		defer leases.Close()
		if st, err := leases.Inspect(ctx, "refused"); err != nil || st.Exists {
			t.Fatalf("inspect: %+v %v, want no lease", st, err)
		}
	})
	t.Run("certificate names the user", func(t *testing.T) {
		// etcd's --client-cert-auth: with authentication on, a request
		// without a token acts as the user its certificate's Common Name
		// names. The certificate is then a credential like a password.
		cnCert, cnKey := pki.Issue(t, "cn-user", user)
		cli := dialTLS(t, srv.Endpoints(), pki.ClientTLS(t, cnCert, cnKey), "", "")
		leases, err := fenceetcd.NewLeaseStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		defer leases.Close()
		g, err := leases.Acquire(ctx, "by-certificate", "host-3", 10*time.Second)
		if err != nil {
			t.Fatalf("acquire as the certificate's user: %v", err)
		}
		if err := leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("least privilege", func(t *testing.T) {
		cli := dialTLS(t, srv.Endpoints(), appTLS, user, appPassword)
		for name, f := range map[string]func() error{
			"put outside its prefixes": func() error { _, err := cli.Put(ctx, "/other/key", "x"); return err },
			"read outside":             func() error { _, err := cli.Get(ctx, "/other/", clientv3.WithPrefix()); return err },
			"delete every key":         func() error { _, err := cli.Delete(ctx, "\x00", clientv3.WithFromKey()); return err },
			"add a user":               func() error { _, err := cli.UserAdd(ctx, "intruder", "x"); return err },
			"grant itself more":        func() error { return grantPrefix(ctx, cli, role, "/") },
			"disable authentication":   func() error { _, err := cli.AuthDisable(ctx); return err },
		} {
			if err := f(); err == nil || !strings.Contains(err.Error(), "permission denied") {
				t.Errorf("%s: got %v, want permission denied", name, err)
			}
		}
		// The library under a prefix its role does not cover: refused,
		// with the grant to ask for.
		other, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix("/other"))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		_, err = other.Acquire(ctx, "job", "host-1", 10*time.Second)
		if !errors.Is(err, leasecore.ErrConfig) {
			t.Fatalf("got %v, want an error wrapping ErrConfig", err)
		}
		wantWords(t, err, "permission denied", "etcdctl role grant-permission")
	})
}

// handshake makes a TLS connection to endpoint (an https:// URL) and
// reads from it, which is where a server's refusal of the client's
// certificate arrives in TLS 1.3.
func handshake(endpoint string, tc *tls.Config) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: servedWait}, "tcp", strings.TrimPrefix(endpoint, "https://"), tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(servedWait)); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

// grantPrefix gives role read and write on every key under prefix
// (etcdctl role grant-permission ROLE readwrite --prefix=true PREFIX).
func grantPrefix(ctx context.Context, cli *clientv3.Client, role, prefix string) error {
	_, err := cli.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
	return err
}

// newTLSClient makes a client of endpoints with TLS (nil: plain) and a
// user (none when empty). With a user, clientv3.New authenticates before
// it returns, for at most dialTimeout (without one, for ever when the
// connection fails); without, it connects on first use.
func newTLSClient(endpoints []string, tc *tls.Config, user, password string, dialTimeout time.Duration) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tc, Username: user, Password: password,
		DialTimeout: dialTimeout, Logger: zap.NewNop()})
}

// Timeouts: a client that is to succeed gets time for a loaded machine (a
// race-enabled binary, CPUs shared with other tests: etcd checks a
// password with bcrypt); one that is to be refused waits out refusedWait,
// because the client retries a connection that fails its TLS handshake
// until its deadline.
const (
	servedWait  = 30 * time.Second
	refusedWait = time.Second
)

// dialTLS is newTLSClient for a client that is to be served, failing the
// test on error and closing the client when the test ends.
func dialTLS(t *testing.T, endpoints []string, tc *tls.Config, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := newTLSClient(endpoints, tc, user, password, servedWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
