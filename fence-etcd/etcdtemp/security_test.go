package etcdtemp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// selfSigned writes a certificate for 127.0.0.1 that is its own CA and serves as server and
// client certificate alike, with its key, into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "etcdtemp test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
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
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
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

// TestClientTLSAndAuth: a server with client TLS, client certificates required and
// authentication on serves over https; root logs in with the password; a request without a
// user is refused; and the server comes back the same after KillRestart, whose probes need TLS
// and root's password.
func TestClientTLSAndAuth(t *testing.T) {
	cert, key := selfSigned(t, t.TempDir())
	s := StartTB(t, WithLog(testLog{t}), WithAuth("root-secret"), WithClientTLS(ClientTLS{
		CertFile: cert, KeyFile: key, TrustedCAFile: cert, ClientCertAuth: true, ClientCertFile: cert, ClientKeyFile: key,
	}))
	if !strings.HasPrefix(s.Endpoints()[0], "https://127.0.0.1:") {
		t.Fatalf("endpoint %s, want https", s.Endpoints()[0])
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(pair.Leaf)
	tc := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}
	dial := func(user, password string) *clientv3.Client {
		t.Helper()
		cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), TLS: tc, Username: user, Password: password,
			DialTimeout: 30 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	ctx := context.Background()
	root := dial("root", "root-secret")
	if _, err := root.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put as root: %v", err)
	}
	// The certificate's Common Name, "etcdtemp test", names no user.
	if _, err := dial("", "").Get(ctx, "k"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("get without a user: %v, want permission denied", err)
	}
	if _, err := s.KillRestart(ctx); err != nil {
		t.Fatalf("KillRestart: %v", err)
	}
	resp, err := dial("root", "root-secret").Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after KillRestart: %v %v", resp, err)
	}
}

// TestSecurityOptionErrors: bad WithClientTLS and WithAuth arguments fail Start before anything
// starts, naming the field; StartCluster refuses both.
func TestSecurityOptionErrors(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithAuth(""), "WithAuth: the root password must not be empty"},
		{WithClientTLS(ClientTLS{CertFile: cert, KeyFile: key}), "WithClientTLS: TrustedCAFile is required"},
		{WithClientTLS(ClientTLS{CertFile: cert, KeyFile: filepath.Join(dir, "none.pem"), TrustedCAFile: cert}), "WithClientTLS: KeyFile:"},
		{WithClientTLS(ClientTLS{CertFile: cert, KeyFile: key, TrustedCAFile: key}), "holds no PEM certificate"},
		{WithClientTLS(ClientTLS{CertFile: cert, KeyFile: key, TrustedCAFile: cert, ClientCertAuth: true}), "ClientCertAuth needs ClientCertFile and ClientKeyFile"},
	} {
		if s, err := Start(context.Background(), tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			if s != nil {
				s.Stop()
			}
			t.Errorf("got %v, want an error with %q", err, tc.want)
		}
	}
	_, err := StartCluster(context.Background(), 3, WithAuth("x"))
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "for Start only") {
		t.Errorf("StartCluster with WithAuth: %v, want ErrInvalidArgument", err)
	}
}
