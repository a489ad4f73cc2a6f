//go:build unix

package pgtemp

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// configureSecurity applies WithSSL and WithPasswordAuth to a cluster initdb has just made: the
// certificate and key copied next to the data directory, their settings put before the
// user's (WithSetting still wins), and pg_hba.conf written afresh.
func (s *server) configureSecurity(cfg config) error {
	if cfg.ssl == nil && !cfg.passwordAuth {
		return nil
	}
	var settings []setting
	if cfg.ssl != nil {
		cert, key := cfg.ssl.certPEM, cfg.ssl.keyPEM // read by Start
		dir := filepath.Join(s.tmpDir, "ssl")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("pgtemp: WithSSL: %w", err)
		}
		certPath, keyPath := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
		// The key file must belong to the server's user and be readable by it alone (or
		// belong to root with mode 0640 at most), or postgres refuses to start.
		for _, f := range []struct {
			path string
			data []byte
		}{{certPath, cert}, {keyPath, key}} {
			if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
				return fmt.Errorf("pgtemp: WithSSL: %w", err)
			}
		}
		if s.user != nil {
			for _, p := range []string{dir, certPath, keyPath} {
				if err := os.Chown(p, int(s.user.uid), int(s.user.gid)); err != nil {
					return fmt.Errorf("pgtemp: WithSSL: handing %s to OS user %s: %w", p, s.user.name, err)
				}
			}
		}
		settings = append(settings, setting{"ssl", "on"}, setting{"ssl_cert_file", certPath}, setting{"ssl_key_file", keyPath})
		s.ssl = true
	}
	s.settings = append(settings, s.settings...)
	// Rewritten in place, so that the file keeps the owner and mode initdb gave it.
	hba := filepath.Join(s.dataDir, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte(hbaConf(cfg.ssl != nil, cfg.passwordAuth)), 0o600); err != nil {
		return fmt.Errorf("pgtemp: writing %s: %w", hba, err)
	}
	s.logf("%s: wrote %s", cfg.securityOptions(), hba)
	return nil
}

// hbaConf is the pg_hba.conf of a cluster with WithSSL or WithPasswordAuth. Lines are matched in
// order and the first match decides; a connection no line matches is refused.
func hbaConf(ssl, password bool) string {
	tcp, method := "host", "trust"
	if ssl {
		tcp = "hostssl"
	}
	if password {
		method = "scram-sha-256"
	}
	var b strings.Builder
	b.WriteString("# Written by pgtemp (WithSSL, WithPasswordAuth).\n")
	b.WriteString("# TYPE    DATABASE USER      ADDRESS       METHOD\n")
	b.WriteString("local     all      all                     trust\n")
	fmt.Fprintf(&b, "%-9s all      %-9s 127.0.0.1/32  trust\n", tcp, superuser)
	fmt.Fprintf(&b, "%-9s all      all       127.0.0.1/32  %s\n", tcp, method)
	if ssl {
		b.WriteString("hostnossl all      all       0.0.0.0/0     reject\n")
	}
	return b.String()
}
