package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// A nightly job writes its own tables (a header row and its lines) in one
// transaction that the fence checks: a frozen instance whose lease expired
// meanwhile is rejected whole, none of its rows appear.
func ExampleFence_RunTx() {
	ctx := context.Background()
	leasePool, err := pgxpool.New(ctx, os.Getenv("LEASE_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer leasePool.Close()
	appPool, err := pgxpool.New(ctx, os.Getenv("APP_DATABASE_URL")) // the job's own database
	if err != nil {
		log.Fatal(err)
	}
	defer appPool.Close()

	leases, err := fencepg.NewLeaseStore(leasePool)
	if err != nil {
		log.Fatal(err)
	}
	fence, err := fencepg.NewFence(appPool) // fence_floor and write_attempt live next to the job's tables
	if err != nil {
		log.Fatal(err)
	}
	// Once, at deploy time: leases.Migrate(ctx); fence.Migrate(ctx).

	sess, err := leasecore.NewSession(ctx, leases, "nightly-invoices", "host-1", leasecore.WithTTL(15*time.Second))
	if errors.Is(err, leasecore.ErrHeld) {
		return // another instance runs tonight's job
	} else if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(context.WithoutCancel(ctx)) // releases the lease: from here on return, never log.Fatal
	// Scope, writer (the holder), token and the token's space: with the
	// space, a write rejected because the scope is fenced by another lease
	// service fails with leasecore.ErrTokenSpace instead of looking stale.
	claim := sess.Claim("invoices")
	// Ends at the session's local deadline or on loss: a holder whose hold
	// ended, or that runs past it, commits nothing and frees its row locks.
	jobCtx := sess.Context()

	// Cut off any older holder at once, before this one has written anything.
	if res, err := fence.Advance(jobCtx, claim); err != nil || !res.Accepted {
		log.Printf("advance: %v (accepted=%t floor=%d)", err, res.Accepted, res.Floor) // an error, or a newer holder took over
		return
	}

	total := 1234 // the long computation; a pause can happen anywhere in here
	res, err := fence.RunTx(jobCtx, claim, func(tx pgx.Tx) error {
		if _, err := tx.Exec(jobCtx, `INSERT INTO job_run (day, total) VALUES (current_date, $1)`, total); err != nil {
			return err
		}
		_, err := tx.Exec(jobCtx, `INSERT INTO invoice (day, customer, amount) VALUES (current_date, 'acme', $1)`, total)
		return err
	})
	switch {
	case err != nil:
		log.Print(err) // RunTx's doc says when the outcome is unknown (an error during COMMIT)
	case !res.Accepted:
		log.Printf("a newer holder (token %d) took over: nothing of ours was written", res.Floor)
	}
}

// The same with database/sql (lib/pq, or pgx's stdlib driver).
func ExampleFenceDB_RunTx() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("APP_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	fence, err := fencepg.NewFenceDB(db)
	if err != nil {
		log.Fatal(err)
	}
	var token leasecore.Token = 7 // Session.Token() of the caller's lease
	res, err := fence.RunTx(ctx, leasecore.Claim{Scope: "invoices", Writer: "host-1", Token: token},
		func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO job_run (day, total) VALUES (current_date, $1)`, 1234)
			return err
		})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("accepted=%t floor=%d", res.Accepted, res.Floor)
}

// The check and the job's statements in one round trip: a rejection
// aborts the whole pipeline.
func ExampleFence_SendBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("APP_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	fence, err := fencepg.NewFence(pool)
	if err != nil {
		log.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO job_run (day, total) VALUES (current_date, $1)`, 1234)
	b.Queue(`INSERT INTO invoice (day, customer, amount) VALUES (current_date, 'acme', $1)`, 1234)
	res, err := fence.SendBatch(ctx, pool, leasecore.Claim{Scope: "invoices", Writer: "host-1", Token: 7}, b)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("accepted=%t floor=%d", res.Accepted, res.Floor)
}

// A transaction the caller begins and fills itself, ended by the fence:
// the comparison and COMMIT go in one round trip.
func ExampleFence_Commit() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("APP_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	fence, err := fencepg.NewFence(pool)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // after Commit it does nothing
	if _, err := tx.Exec(ctx, `INSERT INTO job_run (day, total) VALUES (current_date, $1)`, 1234); err != nil {
		log.Fatal(err)
	}
	res, err := fence.Commit(ctx, tx, leasecore.Claim{Scope: "invoices", Writer: "host-1", Token: 7})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("accepted=%t floor=%d", res.Accepted, res.Floor) // rejected: nothing of tx was kept
}
