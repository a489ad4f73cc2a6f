// Command bench measures what fencing costs, side by side: every variant
// runs in the same process against the same servers, interleaved over
// several rounds, and the report gives medians and ratios of two variants
// of one run (the machines are shared and noisy; absolute numbers are
// not comparable between runs, ratios mostly are). `make bench` runs it.
//
//	bench [-rounds 15] [-benchtime 150ms] [-handoff-samples 100] [-handoff-poll-samples 10]
//	      [-handoff-members 4] [-out evidence/bench] [-lab run.sh] [-docs docs/performance.md]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

func main() {
	// The bench's etcd server is this binary, re-executed (etcdtemp).
	if len(os.Args) > 1 && os.Args[1] == "etcd-server" && etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	testing.Init() // Go's benchmark harness, outside go test
	rounds := flag.Int("rounds", 15, "rounds after a warm-up round; each runs every ratio's two variants back to back, pairs in a random order")
	benchtime := flag.Duration("benchtime", 150*time.Millisecond, "target time per variant per round")
	out := flag.String("out", "", "directory to write the report (latest.txt) to; empty: stdout only")
	lab := flag.String("lab", "", "path of run.sh: when set, the whole lab is timed once (lab_wall_seconds)")
	scaling := flag.String("scaling", "1,1000,100000", "existing leases/scopes for the scaling table")
	handoff := flag.Int("handoff-samples", 100, "handoff samples per variant (step-downs), after a warm-up one")
	handoffPoll := flag.Int("handoff-poll-samples", 10, "handoff samples of the 2 s poller (up to 2 s each), at most -handoff-samples")
	handoffMembers := flag.Int("handoff-members", defaultHandoffMembers, "campaigners of each handoff variant's lease, each on a client of its own: one leads, the others wait")
	docs := flag.String("docs", "", "markdown file whose bench section (between <!-- bench:begin --> and <!-- bench:end -->) gets this run's report")
	flag.Parse()
	if *rounds < 1 {
		fmt.Fprintf(os.Stderr, "bench: -rounds %d: must be at least 1\n", *rounds)
		os.Exit(2)
	}
	if *handoffPoll < 1 || *handoffPoll > *handoff {
		fmt.Fprintf(os.Stderr, "bench: -handoff-samples %d, -handoff-poll-samples %d: want 1 <= poll samples <= samples\n", *handoff, *handoffPoll)
		os.Exit(2)
	}
	if *handoffMembers < 2 {
		fmt.Fprintf(os.Stderr, "bench: -handoff-members %d: must be at least 2\n", *handoffMembers)
		os.Exit(2)
	}
	if err := flag.Set("test.benchtime", benchtime.String()); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, config{stdout: os.Stdout, rounds: *rounds, out: *out, lab: *lab, scaling: *scaling, docs: *docs,
		handoffSamples: *handoff, handoffPollSamples: *handoffPoll, handoffMembers: *handoffMembers}); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
