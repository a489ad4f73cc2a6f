package fenceetcd_test

import (
	"context"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// A report job announces "report published" to a service that cannot
// check fencing tokens: the announcement is an outbox entry in the same
// Txn as the report, under the fence, so a stale instance's announcement
// never exists; a relay delivers entries with the token as their version.
// (It needs an etcd server, so it is not run as a test.)
func ExampleOutbox() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	fence, err := fenceetcd.NewFence(cli)
	if err != nil {
		log.Fatal(err)
	}
	outbox, err := fenceetcd.NewOutbox(cli) // the Fence's prefix: its entries' guard reads that floor
	if err != nil {
		log.Fatal(err)
	}
	var claim leasecore.Claim // g.Claim("daily-report") after fence.Advance (see ExampleFence_Commit)

	entry, err := outbox.Add(claim, "report-published", []byte(`{"day":"2026-12-03"}`))
	if err != nil {
		log.Fatal(err)
	}
	res, _, err := fence.Commit(ctx, claim, fenceetcd.Txn{Then: []clientv3.Op{
		clientv3.OpPut("/reports/2026-12-03", "..."),
		entry,
	}})
	if err != nil {
		log.Fatal(err)
	} else if !res.Accepted {
		return // a newer holder took over: neither the report nor its announcement was written
	}

	// The relay, in any process: one pass delivers everything pending.
	n, err := outbox.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
		// Send e.ID, e.Scope, e.Token (the version), e.Topic and e.Payload to
		// the downstream; return nil only once it acknowledged, also when it
		// answered "duplicate" (an ID it has seen) or "stale" (a version
		// below the highest it accepted for the scope).
		return nil
	})
	log.Printf("delivered %d entries (%v)", n, err)
}
