// Command lab runs the leasefence experiments (the conformance suite) on
// every backend configuration against servers it starts itself, and writes
// the evidence files. examples/lease-fencing/run.sh (make lab) runs it.
//
//	lab [-port 55426] [-out evidence/26] [-configs pgx,libpq] [-cases F1,F3]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		port    = flag.Int("port", 55426, "loopback port of the temporary PostgreSQL cluster")
		out     = flag.String("out", "evidence/26", "directory the output files are written to")
		configs = flag.String("configs", strings.Join(configNames(), ","), "configurations to run, comma-separated")
		caseIDs = flag.String("cases", "", "cases to run, comma-separated (default: all)")
	)
	flag.Parse()

	// Ctrl-C or SIGTERM cancels the run; everything started is stopped on
	// the way out (the cluster also dies with this process: pgtemp sets a
	// parent-death signal).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	lab := &lab{port: *port, outDir: *out, progress: os.Stderr}
	if *caseIDs != "" {
		lab.cases = strings.Split(*caseIDs, ",")
	}
	failed, err := lab.run(ctx, strings.Split(*configs, ","))
	fmt.Printf("lab: total wall time %.1fs\n", time.Since(start).Seconds())
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "lab: %v\n", err)
		return 1
	case failed > 0:
		fmt.Fprintf(os.Stderr, "lab: %d check(s) failed\n", failed)
		return 1
	}
	return 0
}
