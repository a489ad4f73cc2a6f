package pgtemp

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// externalServer is an existing server named by LEASEFENCE_PG_URL, for machines where pgtemp
// cannot start PostgreSQL itself (no binaries, a managed database in CI). pgtemp does not own it:
// it only creates databases there and drops them again.
type externalServer struct {
	url  *url.URL
	host string
	port int
	logf func(format string, args ...any)

	mu      sync.Mutex
	created []string
}

func startExternal(ctx context.Context, raw string, logf func(string, ...any)) (*externalServer, serverInfo, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		// The parse error would quote the URL, password included.
		return nil, serverInfo{}, fmt.Errorf("pgtemp: %s is not a postgres://user@host:port/ URL", envURL)
	}
	e := &externalServer{url: u, host: u.Hostname(), port: 5432, logf: logf}
	if p := u.Port(); p != "" {
		if e.port, err = strconv.Atoi(p); err != nil {
			return nil, serverInfo{}, fmt.Errorf("pgtemp: %s: bad port %q", envURL, p)
		}
	}
	conn, err := pgx.Connect(ctx, e.maintenanceDSN())
	if err != nil {
		return nil, serverInfo{}, fmt.Errorf("pgtemp: external server %s (%s): %w", u.Redacted(), envURL, err)
	}
	defer closeConn(conn)
	info, err := queryServerInfo(ctx, conn)
	if err != nil {
		return nil, serverInfo{}, fmt.Errorf("pgtemp: external server %s (%s): %w", u.Redacted(), envURL, err)
	}
	logf("using external server %s from %s, PostgreSQL %s; nothing started, RestartImmediate not supported",
		u.Redacted(), envURL, info.version)
	return e, info, nil
}

// dsn keeps everything the user put in the URL (password, sslmode, options) and swaps the
// database.
func (e *externalServer) dsn(database string) string {
	u := *e.url
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// maintenanceDSN is the URL as given, or its "postgres" database if it names none.
func (e *externalServer) maintenanceDSN() string {
	if e.url.Path == "" || e.url.Path == "/" {
		return e.dsn(maintenanceDB)
	}
	return e.url.String()
}

func (e *externalServer) remember(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.created, name) {
		e.created = append(e.created, name)
	}
}

// stop drops what CreateDatabase made. Failures are logged, not returned: the server is shared,
// a leftover database is recreated by the next run anyway, and failing a test in its cleanup
// for that would only hide the real result.
func (e *externalServer) stop(versionNum int) {
	e.mu.Lock()
	names := slices.Clone(e.created)
	e.created = nil
	e.mu.Unlock()
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.maintenanceDSN())
	if err != nil {
		e.logf("stop: cannot connect to drop databases %v: %v", names, err)
		return
	}
	defer closeConn(conn)
	for _, name := range names {
		if err := dropDatabase(ctx, conn, versionNum, name); err != nil {
			e.logf("stop: dropping database %q: %v", name, err)
			continue
		}
		e.logf("stop: dropped database %q", name)
	}
}
