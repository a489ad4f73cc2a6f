package pgtemp_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// The lab's use: a cluster on a fixed port, a fresh database, a crash.
func ExampleStart() {
	ctx := context.Background()
	c, err := pgtemp.Start(ctx, pgtemp.WithPort(55426), pgtemp.WithLog(os.Stderr))
	if err != nil {
		log.Fatal(err) // errors.Is(err, pgtemp.ErrNoBinaries): the message says what to install
	}
	defer c.Stop()

	if err := c.CreateDatabase(ctx, "res26"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.DSN("res26"))

	downtime, err := c.RestartImmediate(ctx)
	if err != nil {
		log.Fatal(err) // errors.Is(err, pgtemp.ErrNotSupported) with LEASEFENCE_PG_URL
	}
	fmt.Println("recovered from WAL after", downtime)
}
