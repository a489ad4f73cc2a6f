package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// The Go blocks of README.md and docs/ are runs of lines of files like
// this one, which compile with the package's tests; gomodtest's
// TestDocsGoBlocks fails when a block and its source differ.

// quickStart is README.md's quick start.
func quickStart(ctx context.Context, instance string, day time.Time, customer string, amount int64) error {
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		return err
	}
	leases, err1 := fencepg.NewLeaseStore(pool) // once, at deploy time: leases.Migrate(ctx)
	fence, err2 := fencepg.NewFence(pool)       // and fence.Migrate(ctx): schema "leasefence"
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	err = leasecore.Run(ctx, leases, "nightly-invoices", instance, func(ctx context.Context, g leasecore.Grant) error {
		res, err := fence.RunTx(ctx, g.Claim("invoices"), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoice (day, customer, amount) VALUES ($1, $2, $3)`, day, customer, amount)
			return err
		})
		if err != nil || res.Accepted {
			return err
		}
		return fmt.Errorf("a newer holder (token %d) took over: nothing was written", res.Floor)
	}, leasecore.WithTTL(15*time.Second))
	if errors.Is(err, leasecore.ErrHeld) {
		return nil // another instance runs tonight's job
	}
	return err
}

// leaderLoop is the leader loop of README.md and docs/leader-election.md.
func leaderLoop(ctx context.Context, leases *fencepg.LeaseStore, fence *fencepg.Fence, instance string,
	writeNextBatch func(pgx.Tx) error) error {
	err := leasecore.Campaign(ctx, leases, "invoice-leader", instance,
		func(ctx context.Context, g leasecore.Grant) error { // ctx ends at the local deadline or on loss
			for ctx.Err() == nil {
				res, err := fence.RunTx(ctx, g.Claim("invoice-batches"), writeNextBatch) // waits for work
				if err != nil {
					return err // while leading: Campaign releases and returns err
				}
				if !res.Accepted {
					<-ctx.Done() // a newer holder of this lease wrote: ours ends at its next renewal
				}
			}
			return context.Cause(ctx) // lost or past the local deadline: Campaign campaigns again
		},
		leasecore.WithSessionOptions(leasecore.WithTTL(15*time.Second)))
	return err
}

// Behind PgBouncer in transaction mode (docs/poolers.md): pgx must not
// keep named prepared statements, and LISTEN does not stay with the
// client, so Campaign polls instead of waiting for a notification.
func ExampleWithoutNotifications() {
	ctx := context.Background()
	leasePool, err := pgxpool.New(ctx, "postgres://app@pgbouncer:6432/leases?default_query_exec_mode=exec")
	if err != nil {
		log.Fatal(err)
	}
	defer leasePool.Close()
	leases, err := fencepg.NewLeaseStore(leasePool, fencepg.WithoutNotifications()) // Campaign polls
	if err != nil {
		log.Fatal(err)
	}
	err = leasecore.Campaign(ctx, leases, "invoice-leader", "host-1",
		func(ctx context.Context, g leasecore.Grant) error { return nil },
		leasecore.WithPollInterval(time.Second))
	if err != nil {
		log.Fatal(err)
	}
}
