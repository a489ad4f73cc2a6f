// Command lab runs the leasefence experiments (the conformance suite) on
// every backend configuration against servers it starts itself, and writes
// the evidence files. examples/lease-fencing/run.sh (make lab) runs it.
//
//	lab [-port 55426] [-out evidence/26] [-configs pgx,libpq] [-cases F1,F3] [-sets 2]
//	lab -serve    start the cluster with empty lease26 and res26 and keep it
//	              running until Ctrl-C (for cmd/report-job)
//	lab holder       (internal: the holder process of F4 and F5; see below)
//	lab etcd-server  (internal: the lab's etcd server, a child it can SIGKILL)
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

	"github.com/leasefence/leasefence/examples/lease-fencing/internal/mixed"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
)

func main() {
	// The lab re-executes itself as the holder processes of F4 and F5
	// (pgconformance.HolderCommand with HolderArgs {"holder"}), so the
	// experiment needs no separate build step.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "holder":
			switch {
			case pgconformance.IsHolderProcess():
				os.Exit(pgconformance.HolderMain())
			case etcdconformance.IsHolderProcess():
				os.Exit(etcdconformance.HolderMain())
			case mixed.IsHolderProcess():
				os.Exit(mixed.HolderMain())
			}
			fmt.Fprintln(os.Stderr, "lab holder: started without a holder environment; the lab starts holders itself")
			os.Exit(2)
		case "etcd-server":
			// The lab's etcd server, a child it can SIGKILL (etcdtemp).
			if !etcdtemp.IsServeProcess() {
				fmt.Fprintln(os.Stderr, "lab etcd-server: started without "+etcdtemp.ServeEnv+"; the lab starts it itself")
				os.Exit(2)
			}
			os.Exit(etcdtemp.Serve())
		}
	}
	os.Exit(run())
}

func run() int {
	var (
		port    = flag.Int("port", 55426, "loopback port of the temporary PostgreSQL cluster")
		out     = flag.String("out", "evidence/26", "directory the output files are written to")
		configs = flag.String("configs", strings.Join(configNames(), ","), "configurations to run, comma-separated")
		caseIDs = flag.String("cases", "", "cases to run, comma-separated (default: all)")
		sets    = flag.Int("sets", 1, "server sets per configuration, each running a share of its cases at the same time (2 halves the wall time; for a machine with CPUs to spare)")
		serve   = flag.Bool("serve", false, "only start the cluster with empty lease26 and res26, and wait for Ctrl-C")
	)
	flag.Parse()

	// Ctrl-C or SIGTERM cancels the run; everything started is stopped on
	// the way out (the cluster also dies with this process: pgtemp sets a
	// parent-death signal).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	if *sets < 1 {
		fmt.Fprintf(os.Stderr, "lab: -sets %d: need at least 1\n", *sets)
		return 2
	}
	lab := &lab{port: *port, outDir: *out, sets: *sets, progress: os.Stderr}
	if *serve {
		if err := lab.serve(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "lab: %v\n", err)
			return 1
		}
		return 0
	}
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
