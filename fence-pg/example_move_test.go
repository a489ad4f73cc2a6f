package fencepg_test

import (
	"context"
	"errors"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// The scope "invoices" moves from database db1 to db2 with its floor: the
// seal at db1 in the transaction that reads its rows, the install at db2 in
// the transaction that writes them, then the routing. A holder still
// routed to db1 is rejected with a *leasecore.ScopeMovedError naming
// "db2"; a holder whose token was taken over before the move is rejected at
// db2 as it was at db1. If the mover crashes in between, run it again:
// both steps are idempotent, and until the install every write is
// rejected.
func ExampleFence_Seal() {
	ctx := context.Background()
	oldPool, err := pgxpool.New(ctx, os.Getenv("DB1_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer oldPool.Close()
	newPool, err := pgxpool.New(ctx, os.Getenv("DB2_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer newPool.Close()
	oldFence, err := fencepg.NewFence(oldPool)
	if err != nil {
		log.Fatal(err)
	}
	newFence, err := fencepg.NewFence(newPool)
	if err != nil {
		log.Fatal(err)
	}

	// 1. db1: seal first, then read the rows, in one transaction.
	type invoice struct {
		id     int64
		amount int64
	}
	var rows []invoice
	var seal leasecore.ScopeSeal
	err = pgx.BeginFunc(ctx, oldPool, func(tx pgx.Tx) error {
		var err error
		// Waits for the transactions that passed their check; every check
		// after it is rejected.
		if seal, err = oldFence.Seal(ctx, tx, "invoices", "db2"); err != nil {
			return err // a *leasecore.ScopeMovedError: sealed for another destination before
		}
		rs, err := tx.Query(ctx, `SELECT id, amount FROM invoice WHERE scope = 'invoices'`)
		if err != nil {
			return err
		}
		rows, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (invoice, error) {
			var i invoice
			return i, r.Scan(&i.id, &i.amount)
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// 2. db2: install first, then write the rows, in one transaction.
	errNewer := errors.New("a newer holder already wrote at db2")
	err = pgx.BeginFunc(ctx, newPool, func(tx pgx.Tx) error {
		res, err := newFence.Install(ctx, tx, seal) // the floor becomes seal.Floor, with its token space
		if err != nil {
			return err
		}
		if !res.Accepted {
			return errNewer // the move was completed and used: do not copy older rows over newer ones
		}
		for _, r := range rows {
			if _, err := tx.Exec(ctx, `INSERT INTO invoice (scope, id, amount) VALUES ('invoices', $1, $2)
				ON CONFLICT (scope, id) DO UPDATE SET amount = EXCLUDED.amount`, r.id, r.amount); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNewer) {
		log.Fatal(err)
	}

	// 3. Route "invoices" to db2. Delete its rows at db1 whenever you like:
	// nothing can write them there any more.
}
