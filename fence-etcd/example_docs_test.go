package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// The Go blocks of docs/fencing-etcd.md are runs of lines of this file,
// which compiles with the package's tests; gomodtest's TestDocsGoBlocks
// fails when a block and its source differ.

// etcdQuickStart is docs/fencing-etcd.md's quick start.
func etcdQuickStart(ctx context.Context, instance, invoice string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	leases, err := fenceetcd.NewLeaseStore(cli)
	if err != nil {
		return err
	}
	defer leases.Close() // waits for background clean-up; before cli.Close
	fence, err := fenceetcd.NewFence(cli)
	if err != nil {
		return err
	}
	err = leasecore.Run(ctx, leases, "nightly-billing", instance, func(ctx context.Context, g leasecore.Grant) error {
		res, _, err := fence.Commit(ctx, g.Claim("billing"), fenceetcd.Txn{
			Then: []clientv3.Op{clientv3.OpPut("/billing/invoice/2026-06-01/42", invoice)},
		})
		if err == nil && !res.Accepted {
			err = fmt.Errorf("a newer holder (token %d) took over: nothing was written", res.Floor)
		}
		return err
	}, leasecore.WithTTL(15*time.Second))
	if errors.Is(err, leasecore.ErrHeld) {
		return nil // another instance runs tonight's job
	}
	return err
}

// guardInOwnTxn is docs/fencing-etcd.md's Guard in a Txn of the caller's.
func guardInOwnTxn(ctx context.Context, cli *clientv3.Client, fence *fenceetcd.Fence, claim leasecore.Claim, invoice string) error {
	if res, err := fence.Advance(ctx, claim); err != nil {
		return err
	} else if !res.Accepted {
		return fmt.Errorf("a newer holder (token %d) took over", res.Floor)
	}
	resp, err := cli.Txn(ctx).
		If(fence.Guard(claim)). // the floor still equals our token
		Then(clientv3.OpPut("/billing/invoice/2026-06-01/42", invoice)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errors.New("rejected: a newer holder advanced the floor (Commit would say which token)")
	}
	return nil
}
