package pgtemp

import (
	"crypto/tls"
	"fmt"
	"os"
)

// WithSSL starts the server with SSL on (ssl = on), presenting the certificate in certFile with
// the private key in keyFile (both PEM), and makes it refuse TCP connections that do not use SSL
// (a "hostnossl ... reject" line in pg_hba.conf). A client that verifies the server
// (sslmode=verify-full, which also checks the host name against the certificate) needs the
// certificate to name 127.0.0.1: an IP address SAN. pgtemp copies both files into the cluster's
// directory, owned by the OS user that runs the server and readable by it alone, as PostgreSQL
// requires of a key file; the caller's files may live anywhere this process can read.
//
// pgtemp's own connections, and the URLs DSN returns, then use sslmode=require: encrypted, but
// not verified (pgtemp does not know the CA); a test that verifies builds its own connection
// string with sslmode=verify-full and sslrootcert.
//
// Only the local provider can do this: with Docker, an external server or StartStandbyPair,
// Start fails with an error wrapping ErrNotSupported.
func WithSSL(certFile, keyFile string) Option {
	return func(c *config) { c.ssl = &sslFiles{cert: certFile, key: keyFile} }
}

// WithPasswordAuth makes every role but the superuser that pgtemp and DSN connect as
// authenticate over TCP with its password (scram-sha-256, PostgreSQL's default password
// encryption since version 14): a role created without one cannot log in over TCP. Without it
// the cluster trusts every connection from 127.0.0.1, whoever it claims to be. Only the local
// provider can do this, like WithSSL.
func WithPasswordAuth() Option {
	return func(c *config) { c.passwordAuth = true }
}

// sslFiles are WithSSL's files, and their contents once Start has read them.
type sslFiles struct {
	cert, key       string
	certPEM, keyPEM []byte
}

// securityOptions names the options of this file that were given, for the refusals of the
// providers that cannot honour them.
func (c *config) securityOptions() string {
	switch {
	case c.ssl != nil && c.passwordAuth:
		return "WithSSL and WithPasswordAuth"
	case c.ssl != nil:
		return "WithSSL"
	case c.passwordAuth:
		return "WithPasswordAuth"
	}
	return ""
}

// refuseSecurity fails with ErrNotSupported if an option of this file was given to a provider
// that cannot honour it (where names it).
func (c *config) refuseSecurity(where string) error {
	if opts := c.securityOptions(); opts != "" {
		return &sentinelError{
			sentinel: ErrNotSupported,
			msg:      fmt.Sprintf("pgtemp: %s: %s needs a local cluster (pg_hba.conf and the key file are written before the server starts)", where, opts),
		}
	}
	return nil
}

// load reads WithSSL's files and checks that they are a certificate and its key, before
// anything is started, so that a wrong path or a mismatched pair is reported at once, naming the
// option, rather than as a server that exits during startup.
func (f *sslFiles) load() error {
	cert, err := os.ReadFile(f.cert)
	if err != nil {
		return fmt.Errorf("pgtemp: WithSSL: reading the certificate: %w: %w", err, ErrInvalidOption)
	}
	key, err := os.ReadFile(f.key)
	if err != nil {
		return fmt.Errorf("pgtemp: WithSSL: reading the key: %w: %w", err, ErrInvalidOption)
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return fmt.Errorf("pgtemp: WithSSL(%q, %q): not a PEM certificate and its private key: %w: %w",
			f.cert, f.key, err, ErrInvalidOption)
	}
	f.certPEM, f.keyPEM = cert, key
	return nil
}

// sslMode is the sslmode of pgtemp's own connections and of DSN's URLs.
func sslMode(ssl bool) string {
	if ssl {
		return "require"
	}
	return "disable"
}
