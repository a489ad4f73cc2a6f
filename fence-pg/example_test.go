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

// The lease store and the resource live in two databases, each with its
// own pool; the resource never sees the lease database.
func Example() {
	ctx := context.Background()
	leasePool, err := pgxpool.New(ctx, "postgres://app@db.internal/lease26")
	if err != nil {
		log.Fatal(err)
	}
	defer leasePool.Close()
	resPool, err := pgxpool.New(ctx, "postgres://app@db.internal/res26")
	if err != nil {
		log.Fatal(err)
	}
	defer resPool.Close()

	leases, err := fencepg.NewLeaseStore(leasePool)
	if err != nil {
		log.Fatal(err)
	}
	report, err := fencepg.NewResource(resPool)
	if err != nil {
		log.Fatal(err)
	}
	if err := errors.Join(leases.Migrate(ctx), report.Migrate(ctx)); err != nil {
		log.Fatal(err)
	}

	g, err := leases.Acquire(ctx, "report-job", "holder-a", 15*time.Second)
	if errors.Is(err, leasecore.ErrHeld) {
		return // another instance does the work
	} else if err != nil {
		log.Fatal(err)
	}
	res, err := report.Write(ctx, leasecore.Write{
		Scope: "daily-report", Part: "summary", Content: "rows=201",
		Writer: g.Holder, Token: g.Token, // the token is what makes the write safe
	})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Accepted {
		log.Printf("a newer holder (token %d) wrote first: drop this result", res.Floor)
	}
	if err := leases.Release(ctx, g); err != nil && !errors.Is(err, leasecore.ErrLost) {
		log.Fatal(err)
	}
}
