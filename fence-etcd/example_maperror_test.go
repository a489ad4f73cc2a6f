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

// A lease backend of your own on etcd reports the client's errors with
// leasecore's sentinels, as fenceetcd does: here the renewal of a hold
// kept by an etcd lease. A lease that is gone is a lost hold (ErrLost);
// a server without a leader is worth a retry (ErrUnavailable). (It needs
// an etcd server, so it is not run as a test.)
func ExampleMapError() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	lease, err := cli.Grant(ctx, 15)
	if err != nil {
		log.Fatal(fenceetcd.MapError(ctx, "mybackend", "acquire", err))
	}

	renew := func(ctx context.Context) error {
		if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
			return fenceetcd.MapError(ctx, "mybackend", "renew", err)
		}
		return nil
	}
	switch err := renew(ctx); {
	case errors.Is(err, leasecore.ErrLost):
		log.Print("the hold is over: stop writing, acquire again") // "mybackend: renew: leasecore: lease hold lost: ..."
	case errors.Is(err, leasecore.ErrUnavailable):
		log.Print("no answer: retry until the local deadline")
	case err != nil:
		log.Fatal(err)
	}
}
