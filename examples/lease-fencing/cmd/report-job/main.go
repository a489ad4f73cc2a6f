// Command report-job is the daily report job of the lease-fencing article
// (SOURCES.md), written the way a user of leasefence would write it:
// several instances run it; a Session decides which one works, and the job
// writes its report into tables of its own (a header row and its lines) in
// one transaction that fencepg.Fence checks with the session's fencing
// token, so a paused instance's late transaction is rejected whole.
//
// Start the lab's cluster (go run ./cmd/lab -serve), then run two
// instances; see examples/lease-fencing/README.md for the kill -STOP demo.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// The lab cluster's databases (cmd/lab -serve).
const (
	defaultLeaseDSN    = "postgres://postgres@127.0.0.1:55426/lease26?sslmode=disable"
	defaultResourceDSN = "postgres://postgres@127.0.0.1:55426/res26?sslmode=disable"
)

// The job's own tables, in the report database next to the fence's (which
// live in their own schema, leasefence). A real deployment creates them with
// its migration tool; the job creates them if missing.
const reportTables = `
CREATE TABLE IF NOT EXISTS report_header (
  scope      text PRIMARY KEY,
  built_by   text NOT NULL,
  token      bigint NOT NULL,
  built_at   timestamptz NOT NULL,
  line_count int NOT NULL
);
CREATE TABLE IF NOT EXISTS report_line (
  scope   text,
  line_no int,
  text    text NOT NULL,
  PRIMARY KEY (scope, line_no)
)`

// reportLines is how many lines a report has.
const reportLines = 3

type options struct {
	leaseDSN, resourceDSN string
	holder                string
	ttl, renew, margin    time.Duration
	work, writeDelay      time.Duration
	scope                 string
}

func main() {
	host, _ := os.Hostname()
	var o options
	flag.StringVar(&o.leaseDSN, "lease-dsn", defaultLeaseDSN, "lease database")
	flag.StringVar(&o.resourceDSN, "resource-dsn", defaultResourceDSN, "report database (the protected resource)")
	flag.StringVar(&o.holder, "holder", fmt.Sprintf("%s-%d", host, os.Getpid()), "this instance's holder id")
	flag.StringVar(&o.scope, "scope", "daily-report", "lease name and report scope")
	flag.DurationVar(&o.ttl, "ttl", 3*time.Second, "lease TTL")
	flag.DurationVar(&o.renew, "renew", 800*time.Millisecond, "renewal interval")
	flag.DurationVar(&o.margin, "margin", 600*time.Millisecond, "local safety margin")
	flag.DurationVar(&o.work, "work", 2*time.Second, "how long building the report takes")
	flag.DurationVar(&o.writeDelay, "write-delay", 0,
		"time between the last validity check and the write (a slow upload); freeze the process during it to play the paused holder")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "report-job:", err)
		os.Exit(1)
	}
}

// run is one run of the job: take the lease or leave, cut older holders
// off, build the report, write its tables in one fenced transaction.
func run(ctx context.Context, o options, out *os.File) error {
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "%s %s: %s\n", time.Now().Format("15:04:05.000"), o.holder, fmt.Sprintf(format, args...))
	}
	leasePool, err := pgxpool.New(ctx, o.leaseDSN)
	if err != nil {
		return err
	}
	defer leasePool.Close()
	reportPool, err := pgxpool.New(ctx, o.resourceDSN)
	if err != nil {
		return err
	}
	defer reportPool.Close()
	leases, err := fencepg.NewLeaseStore(leasePool)
	if err != nil {
		return err
	}
	fence, err := fencepg.NewFence(reportPool)
	if err != nil {
		return err
	}
	// Idempotent; a real deployment runs them once at deploy time.
	if err := leases.Migrate(ctx); err != nil {
		return err
	}
	if err := fence.Migrate(ctx); err != nil {
		return err
	}
	if _, err := reportPool.Exec(ctx, reportTables); err != nil {
		return err
	}

	sess, err := leasecore.NewSession(ctx, leases, o.scope, o.holder,
		leasecore.WithTTL(o.ttl), leasecore.WithRenewInterval(o.renew), leasecore.WithMargin(o.margin))
	if errors.Is(err, leasecore.ErrHeld) {
		say("another instance holds the lease: nothing to do")
		return nil
	}
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	say("acquired the lease, token=%d (pid %d)", sess.Token(), os.Getpid())
	claim := leasecore.Claim{Scope: o.scope, Writer: o.holder, Token: sess.Token()}

	// Cut off every older holder now, before this one has written
	// anything: from here on their transactions are rejected.
	if res, err := fence.Advance(ctx, claim); err != nil {
		return err
	} else if !res.Accepted {
		say("a newer holder (token %d) already took over: nothing to do", res.Floor)
		return nil
	}

	// Build the report. Stop early if the session ends: the result would
	// be rejected anyway, so the work would be wasted.
	select {
	case <-time.After(o.work):
	case <-sess.Done():
		say("lost the lease while working (%v): dropping the partial report", sess.Err())
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	builtAt := time.Now()
	lines := make([]string, reportLines)
	for i := range lines {
		lines[i] = fmt.Sprintf("line %d of the report built by %s at %s", i+1, o.holder, builtAt.Format(time.RFC3339))
	}

	if !sess.Valid() {
		say("local deadline passed before the write (%v): dropping the report", sess.Err())
		return nil
	}
	if o.writeDelay > 0 {
		// Everything after the check is invisible to it: a pause here
		// (GC, SIGSTOP, a slow network) lets the lease expire unnoticed.
		say("check passed; writing in %v (freeze me now: kill -STOP %d)", o.writeDelay, os.Getpid())
		time.Sleep(o.writeDelay)
	}
	// The header and every line in one transaction, checked by the fence
	// first: with a stale token nothing of it is written.
	res, err := fence.RunTx(ctx, claim, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO report_header (scope, built_by, token, built_at, line_count)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope) DO UPDATE SET built_by = EXCLUDED.built_by,
			token = EXCLUDED.token, built_at = EXCLUDED.built_at, line_count = EXCLUDED.line_count`,
			o.scope, o.holder, int64(claim.Token), builtAt, len(lines)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM report_line WHERE scope = $1`, o.scope); err != nil {
			return err
		}
		for i, line := range lines {
			if _, err := tx.Exec(ctx, `INSERT INTO report_line (scope, line_no, text) VALUES ($1, $2, $3)`,
				o.scope, i+1, line); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if res.Accepted {
		say("write ACCEPTED with token=%d (floor %d): header and %d lines committed", sess.Token(), res.Floor, len(lines))
	} else {
		say("write REJECTED: token=%d is below the floor %d, a newer holder wrote first; nothing of ours was committed", sess.Token(), res.Floor)
	}
	return nil
}
