package pgtemp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// selfSignedServer writes a self-signed certificate for 127.0.0.1 (its own CA) and its key into
// dir.
func selfSignedServer(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "pgtemp test server"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP(loopback)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{{certFile, "CERTIFICATE", der}, {keyFile, "PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// TestWithSSLAndPasswordAuth: the key files live in the test's own directory, which the server's
// OS user cannot read; the server still starts, serves SSL (DSN asks for it), verifies as
// 127.0.0.1 with sslmode=verify-full, refuses TCP without SSL, and asks every role but the
// superuser for its password.
func TestWithSSLAndPasswordAuth(t *testing.T) {
	localOnly(t)
	ctx := context.Background()
	certFile, keyFile := selfSignedServer(t, t.TempDir())
	c := StartTB(t, WithSSL(certFile, keyFile), WithPasswordAuth(), WithLog(testLog{t}))
	dsn := c.DSN("postgres")
	if !strings.Contains(dsn, "sslmode=require") {
		t.Fatalf("DSN %s, want sslmode=require", dsn)
	}
	su, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	var ssl bool
	if err := su.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Fatalf("superuser connection: ssl %t, %v", ssl, err)
	}
	if _, err := su.Exec(ctx, `CREATE ROLE app LOGIN PASSWORD 'secret'; CREATE ROLE nopw LOGIN`); err != nil {
		t.Fatal(err)
	}
	as := func(user *url.Userinfo, query string) string {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = user
		u.RawQuery = query
		return u.String()
	}
	verify := "sslmode=verify-full&sslrootcert=" + url.QueryEscape(certFile)
	app, err := pgx.Connect(ctx, as(url.UserPassword("app", "secret"), verify))
	if err != nil {
		t.Fatalf("app with its password over verify-full: %v", err)
	}
	app.Close(ctx)
	for _, tc := range []struct {
		name string
		dsn  string
		want string
	}{
		{"no SSL", as(url.UserPassword("app", "secret"), "sslmode=disable"), "no encryption"},
		{"wrong password", as(url.UserPassword("app", "wrong"), verify), "password authentication failed"},
		{"a role without a password", as(url.UserPassword("nopw", "anything"), verify), "password authentication failed"},
	} {
		conn, err := pgx.Connect(ctx, tc.dsn)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: connected", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestWithSSLBadFiles: a missing file or a key that is not the certificate's fails Start at once,
// naming WithSSL, before anything is created; a provider that cannot honour the options refuses
// them.
func TestWithSSLBadFiles(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := selfSignedServer(t, dir)
	otherCert, _ := selfSignedServer(t, t.TempDir())
	for _, tc := range []struct {
		name       string
		cert, key  string
		want       string
		wantErrors error
	}{
		{"missing certificate", filepath.Join(dir, "nope.crt"), keyFile, "WithSSL: reading the certificate", ErrInvalidOption},
		{"key of another certificate", otherCert, keyFile, "not a PEM certificate and its private key", ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			localOnly(t)
			c, err := Start(context.Background(), WithSSL(tc.cert, tc.key))
			if err == nil {
				c.Stop()
				t.Fatal("started")
			}
			if !errors.Is(err, tc.wantErrors) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v mentioning %q", err, tc.wantErrors, tc.want)
			}
		})
	}
	t.Run("external server", func(t *testing.T) {
		t.Setenv(envURL, "postgres://postgres@127.0.0.1:1/postgres")
		t.Setenv(envDocker, "")
		_, err := Start(context.Background(), WithSSL(certFile, keyFile))
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "WithSSL") {
			t.Fatalf("got %v, want ErrNotSupported naming WithSSL", err)
		}
	})
}
