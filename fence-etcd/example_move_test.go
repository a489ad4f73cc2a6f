package fenceetcd_test

import (
	"context"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
)

// The scope "billing" moves from cluster A to cluster B with its floor:
// the seal at A reads the scope's keys in its transaction, the install at
// B puts them in its transaction, then the routing. A holder still routed
// to A is rejected with a *leasecore.ScopeMovedError naming "cluster-b"; a
// holder whose token was taken over before the move is rejected at B as it
// was at A. If the mover stops in between, run it again: both steps are
// idempotent, and until the install every write is rejected. (It needs two
// etcd clusters, so it is not run as a test.)
func ExampleFence_Seal() {
	ctx := context.Background()
	dial := func(endpoint string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		return cli
	}
	oldCli, newCli := dial("cluster-a:2379"), dial("cluster-b:2379")
	defer oldCli.Close()
	defer newCli.Close()
	oldFence, err := fenceetcd.NewFence(oldCli)
	if err != nil {
		log.Fatal(err)
	}
	newFence, err := fenceetcd.NewFence(newCli)
	if err != nil {
		log.Fatal(err)
	}

	// 1. Cluster A: seal, and read the keys in the same transaction.
	seal, read, err := oldFence.Seal(ctx, "billing", "cluster-b", clientv3.OpGet("/billing/", clientv3.WithPrefix()))
	if err != nil {
		log.Fatal(err) // a *leasecore.ScopeMovedError: sealed for another destination before
	}

	// 2. Cluster B: install, and put the keys in the same transaction.
	var puts []clientv3.Op
	for _, kv := range read.Responses[0].GetResponseRange().Kvs {
		puts = append(puts, clientv3.OpPut(string(kv.Key), string(kv.Value)))
	}
	res, _, err := newFence.Install(ctx, seal, puts...)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Accepted {
		// A newer holder (token res.Floor) already wrote at B: the move was
		// completed and used; nothing of the copy was applied.
		log.Printf("billing is in use at cluster B already")
	}

	// 3. Route "billing" to cluster B. Delete its keys at A whenever you
	// like: nothing can write them there any more.
}
