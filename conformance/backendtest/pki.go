package backendtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a certificate authority made at run time for one test (the TLS
// tests of fence-pg, fence-etcd and the leasefence command share it;
// etcdtemp and pgtemp keep small copies of their own, to keep this module
// out of their graphs), with its certificate in CAFile, issuing
// certificates into the test's temporary directory.
type PKI struct {
	CAFile string
	dir    string
	ca     *x509.Certificate
	key    *ecdsa.PrivateKey
}

// NewPKI makes a CA whose certificate's Common Name includes name.
func NewPKI(tb testing.TB, name string) *PKI {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: "leasefence test CA " + name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	p := &PKI{dir: tb.TempDir(), ca: ca, key: key}
	p.CAFile = writePEM(tb, filepath.Join(p.dir, "ca.crt"), "CERTIFICATE", der)
	return p
}

// Issue makes a certificate for server and client use with Common Name cn
// and ips as its IP address SANs, and returns its files.
func (p *PKI) Issue(tb testing.TB, name, cn string, ips ...net.IP) (certFile, keyFile string) {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return writePEM(tb, filepath.Join(p.dir, name+".crt"), "CERTIFICATE", der),
		writePEM(tb, filepath.Join(p.dir, name+".key"), "PRIVATE KEY", keyDER)
}

// ClientTLS is a client's TLS configuration that trusts the CA and
// presents the given certificate.
func (p *PKI) ClientTLS(tb testing.TB, certFile, keyFile string) *tls.Config {
	tb.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Config{RootCAs: p.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// Pool is a certificate pool holding the CA.
func (p *PKI) Pool() *x509.CertPool {
	roots := x509.NewCertPool()
	roots.AddCert(p.ca)
	return roots
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func writePEM(tb testing.TB, path, kind string, der []byte) string {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}
