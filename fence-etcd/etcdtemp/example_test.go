package etcdtemp_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// The lab's use: the lab binary has an "etcd-server" subcommand that runs
// os.Exit(etcdtemp.Serve()), and crashes the server in the middle of a run.
func ExampleStart() {
	ctx := context.Background()
	s, err := etcdtemp.Start(ctx, etcdtemp.WithArgs("etcd-server"), etcdtemp.WithLog(os.Stderr))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop()
	fmt.Println("etcd", s.Version(), "at", s.Endpoints())

	downtime, err := s.KillRestart(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("recovered from the WAL after", downtime)
}
