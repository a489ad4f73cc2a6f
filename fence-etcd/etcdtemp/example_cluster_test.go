package etcdtemp_test

import (
	"context"
	"fmt"
	"log"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// A failover and a partition on three members, from a program whose "etcd-server" subcommand
// runs os.Exit(etcdtemp.Serve()) (a test binary needs no WithArgs: its TestMain does it).
func ExampleStartCluster() {
	ctx := context.Background()
	c, err := etcdtemp.StartCluster(ctx, 3, etcdtemp.WithArgs("etcd-server"), etcdtemp.WithLog(os.Stderr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Stop()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	leader, err := c.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Kill(leader); err != nil { // SIGKILL, not restarted
		log.Fatal(err)
	}
	next, err := c.Leader(ctx) // waits until the other two have elected one
	if err != nil {
		log.Fatal(err)
	}
	if _, err := cli.Put(ctx, "k", "v"); err != nil { // the client moves to a live member
		log.Fatal(err)
	}
	if err := c.Restart(ctx, leader); err != nil { // same data directory; it catches up
		log.Fatal(err)
	}

	if err := c.Partition(next); err != nil { // cut off from the others; they elect a leader
		log.Fatal(err)
	}
	if err := c.Heal(next); err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Describe())
}
