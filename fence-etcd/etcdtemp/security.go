package etcdtemp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ClientTLS is the transport security of a server's client port (WithClientTLS): the files of
// etcd's --cert-file, --key-file and --trusted-ca-file, whether it requires client
// certificates (--client-cert-auth), and the certificate etcdtemp itself presents. All are PEM
// files; the server reads them when it starts, and again at every KillRestart.
type ClientTLS struct {
	// CertFile and KeyFile are the server's certificate and private key. Clients connect to
	// 127.0.0.1, so a client that verifies the server needs an IP address SAN 127.0.0.1 in it.
	CertFile, KeyFile string
	// TrustedCAFile holds the CA certificates that client certificates must chain to; etcdtemp's
	// own clients trust them for the server's certificate too. Required.
	TrustedCAFile string
	// ClientCertAuth makes the server refuse a client that presents no certificate signed by a
	// CA of TrustedCAFile. With authentication on (WithAuth), the certificate's Common Name
	// then names the etcd user of a request that carries no token: a client that gives no
	// user name and password acts as that user, if it exists.
	ClientCertAuth bool
	// ClientCertFile and ClientKeyFile are the certificate and key etcdtemp presents to the
	// server for its own requests (readiness probes, WithAuth's setup). Required with
	// ClientCertAuth. etcdtemp always authenticates with the root password as well, so the
	// certificate's Common Name need not name a user.
	ClientCertFile, ClientKeyFile string
}

// WithClientTLS makes the server serve clients over TLS only, as t says: Endpoints then returns
// an https:// URL, and a client needs clientv3.Config.TLS with a RootCAs pool holding the CA
// that signed t.CertFile (and a certificate of its own with t.ClientCertAuth). Peer traffic,
// between the members of a cluster, is not concerned. Start only: StartCluster refuses it.
func WithClientTLS(t ClientTLS) Option {
	return func(c *config) { c.tls = &t }
}

// WithAuth turns etcd's authentication on once the server serves: etcdtemp creates the user
// root with rootPassword and the role root, grants the role to the user, and enables
// authentication (etcdctl user add root; user grant-role root root; auth enable). Every request
// then needs a user (a token from Authenticate, or the Common Name of a verified client
// certificate); etcdtemp's own requests, such as KillRestart's probes, authenticate as root.
// The test creates its own users and roles through a client logged in as root. rootPassword must
// not be empty. Start only: StartCluster refuses it.
func WithAuth(rootPassword string) Option {
	return func(c *config) {
		c.auth = true
		c.rootPassword = rootPassword
	}
}

// rootUser is the user WithAuth creates, and its role: etcd's administrative names.
const rootUser = "root"

// validateSecurity checks WithClientTLS's and WithAuth's arguments and builds the TLS
// configuration of etcdtemp's own clients (nil without WithClientTLS).
func (c *config) validateSecurity() (*tls.Config, error) {
	if c.auth && c.rootPassword == "" {
		return nil, errors.New("etcdtemp: WithAuth: the root password must not be empty")
	}
	t := c.tls
	if t == nil {
		return nil, nil
	}
	for _, f := range []struct{ name, path string }{
		{"CertFile", t.CertFile}, {"KeyFile", t.KeyFile}, {"TrustedCAFile", t.TrustedCAFile},
	} {
		if f.path == "" {
			return nil, fmt.Errorf("etcdtemp: WithClientTLS: %s is required", f.name)
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("etcdtemp: WithClientTLS: %s: %w", f.name, err)
		}
	}
	if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
		return nil, fmt.Errorf("etcdtemp: WithClientTLS: CertFile and KeyFile: %w", err)
	}
	pem, err := os.ReadFile(t.TrustedCAFile)
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: WithClientTLS: TrustedCAFile: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("etcdtemp: WithClientTLS: TrustedCAFile %s holds no PEM certificate", t.TrustedCAFile)
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	switch {
	case t.ClientCertFile != "" || t.ClientKeyFile != "":
		pair, err := tls.LoadX509KeyPair(t.ClientCertFile, t.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcdtemp: WithClientTLS: ClientCertFile and ClientKeyFile: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case t.ClientCertAuth:
		return nil, errors.New("etcdtemp: WithClientTLS: ClientCertAuth needs ClientCertFile and ClientKeyFile, the certificate etcdtemp's own requests present")
	}
	return cfg, nil
}

// scheme is the client URL's scheme.
func (s *Server) scheme() string {
	if s.clientTLS != nil {
		return "https"
	}
	return "http"
}

// clientConfig is the configuration of etcdtemp's own clients of this server: its TLS, and root's
// credentials once WithAuth has turned authentication on.
func (s *Server) clientConfig() clientv3.Config {
	cfg := clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: time.Second,
		// The client's default logger warns on every retry while etcd starts up.
		Logger: zap.NewNop(),
	}
	if s.clientTLS != nil {
		cfg.TLS = s.clientTLS.Clone()
	}
	if s.authOn {
		cfg.Username, cfg.Password = rootUser, s.rootPassword
	}
	return cfg
}

// enableAuth is WithAuth's setup, on a server that serves and has no users yet.
func (s *Server) enableAuth(ctx context.Context) error {
	cli, err := clientv3.New(s.clientConfig())
	if err != nil {
		return fmt.Errorf("etcdtemp: WithAuth: %w", err)
	}
	defer cli.Close()
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"role add root", func() error { _, err := cli.RoleAdd(ctx, rootUser); return err }},
		{"user add root", func() error { _, err := cli.UserAdd(ctx, rootUser, s.rootPassword); return err }},
		{"user grant-role root root", func() error { _, err := cli.UserGrantRole(ctx, rootUser, rootUser); return err }},
		{"auth enable", func() error { _, err := cli.AuthEnable(ctx); return err }},
	} {
		if err := step.do(); err != nil {
			return fmt.Errorf("etcdtemp: WithAuth: %s: %w", step.what, err)
		}
	}
	s.authOn = true
	s.logf("authentication enabled (user %s)", rootUser)
	return nil
}
