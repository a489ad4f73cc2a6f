package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
	leasefencemetrics "github.com/leasefence/leasefence/metrics"
)

// holderEnv makes the test binary holder A of the frozen-holder run: it
// carries the DSN of the database with the lease and the fence.
const holderEnv = "LEASEFENCE_METRICS_HOLDER_DSN"

// The F4 timing, the conformance suite's: TTL 1500 ms, a renewal every
// 400 ms, a local margin of 300 ms.
const (
	lease      = "nightly-invoices"
	scope      = "invoices"
	f4TTL      = 1500 * time.Millisecond
	f4Renew    = 400 * time.Millisecond
	f4Margin   = 300 * time.Millisecond
	insertRow  = `INSERT INTO invoice (writer, token) VALUES ($1, $2)`
	invoiceDDL = `CREATE TABLE IF NOT EXISTS invoice (writer text NOT NULL, token bigint NOT NULL)`
)

// TestMain doubles as holder A: the frozen-holder test re-executes this
// test binary with holderEnv set.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(holderEnv); dsn != "" {
		if err := holderMain(dsn); err != nil {
			fmt.Println("ERROR", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holderMain is holder A, set up as a user of the metrics would: its own
// registry served over HTTP, the session and the fence observed by the
// collectors and logged as JSON to stderr. It acquires the lease, advances
// the fence, passes its pre-write check and says
//
//	READY <metrics address> <token>
//
// then waits for a line on stdin — the parent freezes it there, right
// before its write — and writes one invoice row under the fence:
//
//	RESULT accepted=<bool> floor=<floor>
//
// It stays up (serving its metrics) until stdin closes.
func holderMain(dsn string) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	m, err := leasefencemetrics.New(reg)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	leases, err := fencepg.NewLeaseStore(pool)
	if err != nil {
		return err
	}
	fence, err := fencepg.NewFence(pool, fencepg.WithFenceObserver(m.ObserveFence), fencepg.WithLogger(logger))
	if err != nil {
		return err
	}
	sess, err := leasecore.NewSession(ctx, leases, lease, "holder-a",
		leasecore.WithTTL(f4TTL), leasecore.WithRenewInterval(f4Renew), leasecore.WithMargin(f4Margin),
		leasecore.WithSessionObserver(m.ObserveSession), leasecore.WithLogger(logger))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = sess.Close(cctx)
	}()
	claim := sess.Claim(scope)
	if res, err := fence.Advance(ctx, claim); err != nil || !res.Accepted {
		return fmt.Errorf("advance: %+v, %v", res, err)
	}
	if !sess.Valid() { // the pre-write check: it passes, and cannot make the write safe
		return errors.New("the session is not valid before the write")
	}
	fmt.Printf("READY %s %d\n", ln.Addr(), claim.Token)

	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return errors.New("stdin closed before the write")
	}
	// The write is the very next thing A does when it wakes: no check of
	// the session in between, as in F4 of the lease-fencing article
	// (SOURCES.md).
	res, err := fence.RunTx(ctx, claim, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, insertRow, claim.Writer, int64(claim.Token))
		return err
	})
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fmt.Printf("RESULT accepted=%t floor=%d\n", res.Accepted, res.Floor)
	for in.Scan() { // serve the metrics until the parent is done
	}
	return nil
}
