package fencepg_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// A service checks its deployment once at start-up, before it campaigns:
// a wrong DSN, a missing grant, a server with fsync off or tables nobody
// migrated stop it here, with a message that says what to change, instead
// of surfacing at its first acquire or first fenced write.
func ExampleLeaseStore_Preflight() {
	ctx := context.Background()
	leasePool, err := pgxpool.New(ctx, "postgres://app@db.internal/leases") // connects lazily
	if err != nil {
		log.Fatal(err) // a DSN that does not parse
	}
	defer leasePool.Close()
	appPool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
	if err != nil {
		log.Fatal(err)
	}
	defer appPool.Close()
	leases, err := fencepg.NewLeaseStore(leasePool)
	if err != nil {
		log.Fatal(err)
	}
	fence, err := fencepg.NewFence(appPool)
	if err != nil {
		log.Fatal(err)
	}

	// Migrate ran at deploy time, as the tables' owner. Preflight checks the
	// role the pools log in as.
	checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch err := errors.Join(leases.Preflight(checkCtx), fence.Preflight(checkCtx)); {
	case errors.Is(err, leasecore.ErrConfig), errors.Is(err, leasecore.ErrSchema):
		// Unknown database or role, wrong password, a missing GRANT (the
		// message spells it), fsync off (fencepg.ErrNotDurable), tables
		// not migrated: no retry will help.
		log.Fatalf("misconfigured: %v", err)
	case err != nil:
		// leasecore.ErrUnavailable or the deadline: the server may come
		// back; let the supervisor restart us, or retry.
		log.Fatalf("database not reachable: %v", err)
	}

	_ = leasecore.Campaign(ctx, leases, "nightly-invoices", "host-a",
		func(ctx context.Context, g leasecore.Grant) error {
			claim := g.Claim("invoices") // the token and its token space
			_, err := fence.Advance(ctx, claim)
			return err // ... the job's fenced transactions
		})
}
