package fenceetcd_test

import (
	"context"
	"errors"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// A nightly job run by several instances writes two keys of its own — a
// run record and an invoice — under the fence, in one Txn of its own. The
// sequence is: acquire the lease, Advance the scope's floor to the new
// token (a stale instance is cut off from here on, before this one writes
// anything), do the work, Commit. (It needs an etcd server, so it is not
// run as a test.)
func ExampleFence_Commit() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	leases, err := fenceetcd.NewLeaseStore(cli)
	if err != nil {
		log.Fatal(err)
	}
	fence, err := fenceetcd.NewFence(cli)
	if err != nil {
		log.Fatal(err)
	}

	g, err := leases.Acquire(ctx, "nightly-billing", "host-1", 15*time.Second)
	if errors.Is(err, leasecore.ErrHeld) {
		return // another instance runs tonight's job
	} else if err != nil {
		log.Fatal(err)
	}
	defer leases.Release(context.WithoutCancel(ctx), g)
	claim := g.Claim("nightly-billing") // with the token's space: see leasecore.ErrTokenSpace
	if res, err := fence.Advance(ctx, claim); err != nil {
		log.Fatal(err)
	} else if !res.Accepted {
		return // a newer holder (token res.Floor) took over already
	}

	invoice := `{"customer":42,"total":"99.50"}` // the long part: a pause can happen anywhere in here

	res, resp, err := fence.Commit(ctx, claim, fenceetcd.Txn{
		// The job's own condition: write the invoice only once.
		If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("/billing/invoice/2026-06-01/42"), "=", 0)},
		Then: []clientv3.Op{
			clientv3.OpPut("/billing/invoice/2026-06-01/42", invoice),
			clientv3.OpPut("/billing/run/2026-06-01", "done by host-1"),
		},
	})
	switch {
	case err != nil:
		log.Fatal(err)
	case !res.Accepted:
		log.Printf("stale: token %d was overtaken by %d, nothing written", claim.Token, res.Floor)
	case !resp.Succeeded:
		log.Printf("the invoice existed already")
	default:
		log.Printf("written at revision %d", resp.Header.Revision)
	}
}
