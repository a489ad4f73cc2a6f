// Command capacity measures what keeping many leases alive costs a lease
// server (`make capacity` runs it at full scale):
// -holders holders with -names names each (10,000 × 100 = 1,000,000
// leases), acquired through the public API (leasecore.SessionSet on a
// fencepg or fenceetcd LeaseStore), renewed by the sets at TTL/3 for
// -duration, the holders spread over -procs holder processes (this binary,
// re-executed) with real connections of their own.
//
// Phases, one after the other, each on servers of its own (all on loopback,
// durability on):
//
//	pg-per-lease   PostgreSQL (pgtemp), a lease row per name: a holder's
//	               renewal is one RenewAll statement updating its N rows
//	pg-sessions    PostgreSQL, fencepg.WithSharedLeases: a holder's names
//	               hang on one session row, a renewal updates that row
//	etcd-1         one etcd member (etcdtemp), fenceetcd.WithSharedLeases:
//	               a renewal is one read transaction and one keep-alive
//	etcd-3         the same on a 3-member cluster on 127.0.0.1-3
//	               (etcdtemp.StartCluster)
//
// Each phase prints the setup time (acquiring every lease), renewals/s
// achieved against the rate TTL/3 needs, renewal latency p50/p99, the
// names lost (local deadlines missed, and names the server declared lost:
// both must be 0), then measures the same server's capacity with the
// holders gone and prints the RATIO line.
//
// The ratio. U = plain single-row upserts/s (etcd: Puts/s) of the server at
// saturation with 16 clients; S = the holders' own renewal (RenewAll of one
// holder's N names, the very call the sets make) per second at saturation
// with 16 clients; both measured in the same phase, on the same server and
// data, alternating in rounds (medians). One renewal costs the server
// C = U/S upserts' worth of capacity, so the renewal load in
// upsert-equivalents is R×C for R renewals/s achieved, and
//
//	RATIO renewal_load/upsert_capacity = R×C / U = R / S
//
// the share of the server's write capacity the renewals occupy. R/U (as if
// a renewal cost one upsert) is printed beside it: it understates the
// per-lease load by the factor C. Renew of one name (with holder sessions
// and shared leases it extends every name of the holder, unchecked) is
// measured in the same rounds, and the ratio a renewal of that cost would
// give is printed beside. Each phase also prints the server
// processes' CPU (/proc) in the window, at saturation and idle, as a
// cross-check.
//
// A run is valid when every phase kept all its names (no missed local
// deadline, nothing lost at the server) and no acquire failed (failed
// renewal attempts are printed);
// otherwise the report says INVALID and the command exits 1. pg-per-lease
// is the reference (today's design, its figure beside holder sessions'):
// its losses are printed, as MISSED_LOCAL_DEADLINES_PER_LEASE too, but do
// not fail the run.
//
// A slower disk: -slow-disk D puts every server's data directory (through
// TMPDIR, which pgtemp and etcdtemp make their directories in) on a FUSE
// passthrough to a directory on the machine's disk whose every fsync and
// fdatasync returns D later (internal/slowdisk, mounted by a process of its
// own; as root). Every flush still reaches the disk. With -out the report is
// slow-disk-D.txt (slow-disk-1ms.txt), not latest.txt.
//
//	capacity [-holders 10000] [-names 100] [-ttl 15s] [-duration 60s] [-procs 4]
//	         [-conns 16] [-phases pg-per-lease,pg-sessions,etcd-1,etcd-3]
//	         [-sat-clients 16] [-sat-time 5s] [-sat-rounds 3] [-setup-timeout 10m] [-out evidence/capacity]
//	         [-slow-disk 2ms]
//	capacity holders     (internal: a holder process)
//	capacity slow-disk   (internal: mounts -slow-disk's FUSE passthrough)
//	capacity etcd-server (internal: an etcd member, etcdtemp)
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

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "etcd-server":
			if !etcdtemp.IsServeProcess() {
				fmt.Fprintln(os.Stderr, "capacity etcd-server: started without "+etcdtemp.ServeEnv+"; capacity starts it itself")
				os.Exit(2)
			}
			os.Exit(etcdtemp.Serve())
		case "holders":
			os.Exit(holdersMain())
		case slowDiskArg:
			os.Exit(slowDiskMain())
		}
	}
	var cfg config
	flag.IntVar(&cfg.holders, "holders", 10000, "holders (each a leasecore.SessionSet of its own)")
	flag.IntVar(&cfg.names, "names", 100, "names (leases) per holder")
	flag.DurationVar(&cfg.ttl, "ttl", 15*time.Second, "lease TTL; the sets renew every TTL/3")
	flag.DurationVar(&cfg.duration, "duration", 60*time.Second, "measured renewal window, after every lease is acquired")
	flag.DurationVar(&cfg.setupTimeout, "setup-timeout", 10*time.Minute, "per phase: acquires not done by then fail (an INVALID phase) and the phase goes on")
	flag.IntVar(&cfg.procs, "procs", 4, "holder processes")
	flag.IntVar(&cfg.conns, "conns", 16, "connections per holder process (PostgreSQL: pool size; etcd: one client each)")
	phases := flag.String("phases", strings.Join(allPhases, ","), "phases to run, comma-separated, in this order")
	flag.IntVar(&cfg.satClients, "sat-clients", defaultSatClients, "clients of the saturation measurements (with -out, a count other than 16 names the report: latest-64-clients.txt)")
	flag.DurationVar(&cfg.satTime, "sat-time", 5*time.Second, "time per saturation measurement")
	flag.IntVar(&cfg.satRounds, "sat-rounds", 3, "rounds of the two saturation measurements (upserts, renewals), alternating")
	flag.StringVar(&cfg.out, "out", "", "directory for latest.txt (slow-disk-D.txt with -slow-disk D, see -sat-clients); written only by a run at full scale (>= 1,000,000 leases, >= 60 s)")
	flag.Func("slow-disk", "put the servers' data directories on a FUSE passthrough whose every fsync waits this much longer (e.g. 2ms; 0: the passthrough alone); needs root and /dev/fuse", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		if d < 0 {
			return fmt.Errorf("%v: must not be negative", d)
		}
		cfg.slowDisk = &d
		return nil
	})
	flag.Parse()
	cfg.phases = strings.Split(*phases, ",")
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "capacity:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.stdout = os.Stdout
	cfg.progress = os.Stderr
	res, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capacity:", err)
		os.Exit(1)
	}
	if !res.valid() {
		fmt.Fprintln(os.Stderr, "capacity: INVALID run: names were lost or acquires failed (see the report)")
		os.Exit(1)
	}
}
