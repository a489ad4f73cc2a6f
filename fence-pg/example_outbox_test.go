package fencepg_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

// A report job announces "report published" to another service, which
// cannot check fencing tokens. The announcement is an outbox entry added
// in the same fenced transaction as the report: a frozen instance whose
// lease expired is rejected whole, so its announcement never exists. A
// relay, here in the same process, delivers entries with the token as
// their version; the downstream deduplicates by the entry's ID and rejects
// versions below the highest it has seen.
func ExampleOutbox() {
	ctx := context.Background()
	appPool, err := pgxpool.New(ctx, os.Getenv("APP_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer appPool.Close()
	fence, err := fencepg.NewFence(appPool)
	if err != nil {
		log.Fatal(err)
	}
	outbox, err := fencepg.NewOutbox(appPool) // table outbox, created by fence.Migrate with the fence's
	if err != nil {
		log.Fatal(err)
	}
	var claim leasecore.Claim // sess.Claim("daily-report"), after fence.Advance (see ExampleFence_RunTx)

	res, err := fence.RunTx(ctx, claim, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO report (day, body) VALUES ($1, $2)`, "2026-12-03", "..."); err != nil {
			return err
		}
		_, err := outbox.Add(ctx, tx, claim, "report-published", []byte(`{"day":"2026-12-03"}`))
		return err
	})
	if err != nil {
		log.Fatal(err)
	} else if !res.Accepted {
		return // a newer holder took over: neither the report nor its announcement was written
	}

	// The relay: one pass delivers everything pending; run it in a loop.
	deliver := func(ctx context.Context, e leasecore.OutboxEntry) error {
		body, _ := json.Marshal(map[string]any{"id": e.ID, "scope": e.Scope, "version": e.Token,
			"topic": e.Topic, "payload": json.RawMessage(e.Payload)})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://downstream.example/events", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err // not acknowledged: stays pending, delivered again later
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK { // the downstream answers 200 for accepted, duplicate and stale alike
			return fmt.Errorf("downstream: %s", resp.Status)
		}
		return nil
	}
	for ctx.Err() == nil {
		if _, err := outbox.Relay(ctx, deliver); err != nil {
			log.Print(err) // the entry stays pending; the next pass tries again
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
