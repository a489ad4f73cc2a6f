package command

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// etcdSecurityFlags are the etcd flags of transport security and
// authentication, named as etcdctl names its global flags; each has the
// environment variable etcdctl reads for it (ETCDCTL_ and the flag's name
// in upper case, dashes as underscores).
var etcdSecurityFlags = []string{"cacert", "cert", "key", "user", "password", "insecure-skip-tls-verify"}

// envOf is the environment variable etcdctl reads for flag.
func envOf(flag string) string {
	return "ETCDCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// setting is one value of a security flag and where it came from: the
// flag ("--cacert") or its variable ("ETCDCTL_CACERT"); src is "" when
// neither gave it.
type setting struct{ value, src string }

// etcdSetting reads flag: the command line's value if it was given (even
// empty), else its environment variable's.
func (r *runner) etcdSetting(flag, value string) setting {
	if r.opts.set[flag] {
		return setting{value, "--" + flag}
	}
	if v := r.env.Getenv(envOf(flag)); v != "" {
		return setting{v, envOf(flag)}
	}
	return setting{}
}

// etcdAccess is what the client needs besides its endpoints: its TLS
// configuration (nil for plain HTTP) and its user.
type etcdAccess struct {
	tls            *tls.Config
	user, password string
	// tlsFrom names what turned TLS on, for the messages that say what to
	// check.
	tlsFrom string
}

// etcdAccess resolves the security flags and variables for endpoints, as
// usage errors that name the flag or variable: a certificate without its
// key, a password without a user, a user without a password, TLS options
// with a plain http:// endpoint, files that cannot be read or hold no
// certificate.
func (r *runner) etcdAccess(cmd string, endpoints []string) (etcdAccess, error) {
	o := &r.opts
	cacert := r.etcdSetting("cacert", o.cacert)
	cert := r.etcdSetting("cert", o.cert)
	key := r.etcdSetting("key", o.key)
	user := r.etcdSetting("user", o.user)
	password := r.etcdSetting("password", o.password)
	skip := setting{}
	if o.set["insecure-skip-tls-verify"] {
		if o.insecureSkipVerify {
			skip = setting{"true", "--insecure-skip-tls-verify"}
		}
	} else if v := r.env.Getenv(envOf("insecure-skip-tls-verify")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return etcdAccess{}, usagef(cmd, "%s: %s=%q: want true or false", cmd, envOf("insecure-skip-tls-verify"), v)
		}
		if b {
			skip = setting{"true", envOf("insecure-skip-tls-verify")}
		}
	}
	for _, s := range []setting{cacert, cert, key, user} {
		if s.src != "" && s.value == "" {
			return etcdAccess{}, usagef(cmd, "%s: %s: must not be empty", cmd, s.src)
		}
	}

	var a etcdAccess
	// The user: NAME with --password, else NAME:PASSWORD (etcdctl's --user).
	switch {
	case password.src != "" && user.src == "":
		return a, usagef(cmd, "%s: %s given without --user (or %s)", cmd, password.src, envOf("user"))
	case user.src != "" && password.src != "":
		a.user, a.password = user.value, password.value
	case user.src != "":
		name, pw, ok := strings.Cut(user.value, ":")
		if !ok {
			return a, usagef(cmd, "%s: %s %q: no password: give --password (or %s), or NAME:PASSWORD; leasefence does not prompt",
				cmd, user.src, user.value, envOf("password"))
		}
		a.user, a.password = name, pw
	}
	if user.src != "" && (a.user == "" || a.password == "") {
		return a, usagef(cmd, "%s: %s: the user name and the password must not be empty", cmd, user.src)
	}

	// TLS: on when any of its options is given or an endpoint says https.
	var https, plain []string
	for _, e := range endpoints {
		switch {
		case strings.HasPrefix(e, "https://") || strings.HasPrefix(e, "unixs://"):
			https = append(https, e)
		case strings.HasPrefix(e, "http://") || strings.HasPrefix(e, "unix://"):
			plain = append(plain, e)
		}
	}
	for _, s := range []setting{cacert, cert, key, skip} {
		if s.src != "" {
			a.tlsFrom = s.src
			break
		}
	}
	if a.tlsFrom == "" && len(https) > 0 {
		a.tlsFrom = "the https:// endpoint"
	}
	switch {
	case a.tlsFrom == "":
		return a, nil // plain HTTP
	case len(plain) > 0:
		return a, usagef(cmd, "%s: %s asks for TLS, but the endpoint %s is plain HTTP: write https:// (or HOST:PORT)", cmd, a.tlsFrom, plain[0])
	case cert.src != "" && key.src == "":
		return a, usagef(cmd, "%s: %s given without --key (or %s): a client certificate needs its private key", cmd, cert.src, envOf("key"))
	case key.src != "" && cert.src == "":
		return a, usagef(cmd, "%s: %s given without --cert (or %s)", cmd, key.src, envOf("cert"))
	case skip.src != "" && cacert.src != "":
		return a, usagef(cmd, "%s: %s and %s: skipping the verification of the server ignores the CA; give one", cmd, skip.src, cacert.src)
	}
	a.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert.src != "" {
		pem, err := os.ReadFile(cacert.value)
		if err != nil {
			return a, usagef(cmd, "%s: %s: %v", cmd, cacert.src, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return a, usagef(cmd, "%s: %s %s: holds no PEM certificate", cmd, cacert.src, cacert.value)
		}
		a.tls.RootCAs = pool
	}
	if cert.src != "" {
		pair, err := tls.LoadX509KeyPair(cert.value, key.value)
		if err != nil {
			return a, usagef(cmd, "%s: %s and %s: %v", cmd, cert.src, key.src, err)
		}
		a.tls.Certificates = []tls.Certificate{pair}
	}
	if skip.src != "" {
		a.tls.InsecureSkipVerify = true
	}
	return a, nil
}

// explain adds to err, an etcd operation's failure, why a TLS connection
// to the endpoints fails, when one does: clientv3 retries a failed
// handshake until the deadline and reports only the deadline. Each
// endpoint gets one handshake, at most handshakeWait each.
func (b *etcdBackend) explain(err error) error {
	if b.access.tls == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, leasecore.ErrUnavailable)) {
		return err
	}
	for _, e := range b.endpoints {
		host := e
		if u, perr := url.Parse(e); perr == nil && u.Host != "" {
			host = u.Host
		}
		if herr := tlsHandshake(host, b.access.tls); herr != nil {
			return fmt.Errorf("%w; connecting to %s over TLS fails: %v (TLS because of %s; check --cacert, --cert and --key)", err, host, herr, b.access.tlsFrom)
		}
	}
	return err
}

const handshakeWait = 3 * time.Second

// tlsHandshake connects to host with cfg and reads once: a server that
// refuses the client's certificate says so after the handshake (TLS 1.3).
// A server that answers nothing before handshakeWait is no TLS failure.
func tlsHandshake(host string, cfg *tls.Config) error {
	d := &net.Dialer{Timeout: handshakeWait}
	c := cfg.Clone()
	if c.ServerName == "" {
		if h, _, err := net.SplitHostPort(host); err == nil {
			c.ServerName = h
		}
	}
	conn, err := tls.DialWithDialer(d, "tcp", host, c)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(handshakeWait)); err != nil {
		return nil
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // connected and verified; the server waits for the client's request
		}
		return err
	}
	return nil
}

// loginError maps clientv3.New's error: with a user it logs in while it
// connects, so a refused password or a failed connection shows up here.
func loginError(ctx context.Context, user string, err error) error {
	return fmt.Errorf("logging in to etcd as %q (--user, --password): %w", user, fenceetcd.MapError(ctx, "fenceetcd", "authenticate", err))
}
