package leasecore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// A worker that owns many shards keeps them in one SessionSet, renewed
// together; each name has a token of its own (docs/many-leases.md).
func ExampleSessionSet_AcquireAll() {
	ctx := context.Background()
	store := memfence.NewLeases(nil) // in production: a fence-pg or fence-etcd lease store
	if _, err := store.Acquire(ctx, "shard-002", "worker-3", 15*time.Second); err != nil {
		log.Fatal(err)
	}

	set, err := leasecore.NewSessionSet(store, "worker-7", leasecore.WithTTL(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer set.Close(context.Background())
	names := []string{"shard-001", "shard-002", "shard-003"}
	tokens, errs, err := set.AcquireAll(ctx, names)
	if err != nil {
		log.Fatal(err) // nothing was acquired
	}
	for i, name := range names {
		if errs[i] != nil {
			fmt.Println(name, "held by another worker") // errors.Is(errs[i], leasecore.ErrHeld)
			continue
		}
		fmt.Println(name, "token", tokens[i]) // every write for name carries tokens[i] (or set.Token(name))
	}
	// Output:
	// shard-001 token 1
	// shard-002 held by another worker
	// shard-003 token 1
}
