package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/examples/lease-fencing/internal/mixed"
	"github.com/leasefence/leasefence/examples/lease-fencing/internal/timeline"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// The lab's two databases, as in the lease-fencing article (SOURCES.md):
// lease state and resource state on one temporary cluster, apart so the
// resource cannot read the lease table by accident.
const (
	leaseDB    = "lease26"
	resourceDB = "res26"
)

// servers are what the lab started: the PostgreSQL cluster always, etcd
// when a selected configuration needs it.
type servers struct {
	cluster *pgtemp.Cluster
	etcd    *etcdtemp.Server
}

// config is one backend configuration the lab runs the suite on.
type config struct {
	name   string // as given to -configs
	output string // file name under the output directory
	title  string
	// lane groups configurations that share servers and run one after the
	// other; lanes run at the same time, each on servers of its own, so a
	// crash case (F8) in one lane never touches another.
	lane     string
	pg, etcd bool // which servers the configuration uses
	pictures bool // draw F4's and F5's timelines from this run
	harness  func(s servers) conformance.NewHarness
}

// The holder processes of every configuration are this binary's holder
// subcommand; main tells them apart by their environment.
var holderArgs = []string{"holder"}

func pgHarness(driver string, shared bool) func(s servers) conformance.NewHarness {
	return func(s servers) conformance.NewHarness {
		return pgconformance.New(pgconformance.Config{
			Driver:       driver,
			LeaseDSN:     s.cluster.DSN(leaseDB),
			ResourceDSN:  s.cluster.DSN(resourceDB),
			HolderArgs:   holderArgs,
			Cluster:      s.cluster, // F8 crashes it
			SharedLeases: shared,
		})
	}
}

// etcdHarness is the etcd harness on the lab's etcd server, with or
// without shared leases.
func etcdHarness(shared bool) func(s servers) conformance.NewHarness {
	return func(s servers) conformance.NewHarness {
		return etcdconformance.New(etcdconformance.Config{
			Endpoints:    s.etcd.Endpoints(),
			HolderArgs:   holderArgs,
			SharedLeases: shared,
			// F16 starts 3-member clusters of its own on 127.0.0.1-3, their
			// members this binary's etcd-server subcommand too.
			ReplicaMembers: 3,
			ReplicaOptions: []etcdtemp.Option{etcdtemp.WithArgs("etcd-server")},
			Crash: func(ctx context.Context) (string, time.Duration, error) {
				d, err := s.etcd.KillRestart(ctx)
				return "SIGKILL to the etcd server process, restart on the same data directory", d, err
			},
		})
	}
}

var allConfigs = []config{
	{"pgx", "output-pg.txt", "PostgreSQL, lease and resource, pgx/v5", "postgres", true, false, true, pgHarness(pgconformance.DriverPgx, false)},
	// lib/pq on a cluster of its own (a free port), side by side with pgx.
	{"libpq", "output-pg-libpq.txt", "PostgreSQL, lease and resource, lib/pq (database/sql)", "postgres-libpq", true, false, false, pgHarness(pgconformance.DriverLibpq, false)},
	// Holder sessions (fencepg.WithSharedLeases: a holder's names of one
	// TTL on one session row, renewed by one UPDATE), on a cluster of its own.
	{"pgx-sessions", "output-pg-sessions.txt", "PostgreSQL, lease and resource, pgx/v5, holder sessions (fencepg.WithSharedLeases)", "postgres-sessions", true, false, false, pgHarness(pgconformance.DriverPgx, true)},
	{"etcd", "output-etcd.txt", "etcd, lease and resource (tokens are revisions)", "etcd", false, true, false, etcdHarness(false)},
	// The shared-lease mode (fenceetcd.WithSharedLeases: one etcd lease per
	// holder and TTL) has a lane and an etcd server of its own. Most of a
	// configuration's time is its paused-holder timelines, which wait, so
	// lanes side by side keep the lab's wall time near one configuration's.
	{"etcd-shared", "output-etcd-shared.txt", "etcd, lease and resource, shared leases (fenceetcd.WithSharedLeases)", "etcd-shared", false, true, false, etcdHarness(true)},
	{"etcd-lease-pg-resource", "output-etcd-lease-pg-resource.txt", "etcd lease, PostgreSQL resource (pgx/v5)", "pair", true, true, false, func(s servers) conformance.NewHarness {
		return mixed.New(mixed.Config{
			EtcdEndpoints: s.etcd.Endpoints(),
			Resource: pgconformance.Config{
				Driver: pgconformance.DriverPgx, LeaseDSN: s.cluster.DSN(leaseDB), ResourceDSN: s.cluster.DSN(resourceDB),
			},
			HolderArgs: holderArgs,
		})
	}},
}

func configNames() []string {
	var names []string
	for _, c := range allConfigs {
		names = append(names, c.name)
	}
	return names
}

type lab struct {
	port     int
	outDir   string
	cases    []string
	progress io.Writer
}

// run starts the cluster, runs every selected configuration, writes one
// output file per configuration and stops the cluster. It returns the
// number of failed checks.
func (l *lab) run(ctx context.Context, names []string) (failed int, err error) {
	var selected []config
	for _, n := range names {
		i := slices.IndexFunc(allConfigs, func(c config) bool { return c.name == strings.TrimSpace(n) })
		if i < 0 {
			return 0, fmt.Errorf("unknown configuration %q (have %s)", n, strings.Join(configNames(), ", "))
		}
		selected = append(selected, allConfigs[i])
	}
	if err := os.MkdirAll(l.outDir, 0o755); err != nil {
		return 0, err
	}

	var lanes []string
	for _, c := range selected {
		if !slices.Contains(lanes, c.lane) {
			lanes = append(lanes, c.lane)
		}
	}
	rows := make([]limitsRow, len(selected))
	errs := make([]error, len(lanes))
	var pgVersion string
	var wg sync.WaitGroup
	for li, lane := range lanes {
		wg.Go(func() {
			var cfgs []int
			for i, c := range selected {
				if c.lane == lane {
					cfgs = append(cfgs, i)
				}
			}
			// The PostgreSQL lane gets the lab's fixed port; the other
			// lanes' clusters take free ones.
			port := 0
			if lane == "postgres" {
				port = l.port
			}
			errs[li] = l.withServers(ctx, lane, port, selected[cfgs[0]], func(srv servers) error {
				if srv.cluster != nil && lane == "postgres" {
					pgVersion = srv.cluster.Version()
				}
				for _, i := range cfgs {
					row, err := l.runConfig(ctx, srv, selected[i])
					rows[i] = row
					if err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	wg.Wait()
	for _, r := range rows {
		failed += r.Failed
	}
	if err := errors.Join(errs...); err != nil {
		return failed, err
	}
	return failed, l.writeLimits(pgVersion, rows)
}

// withServers starts the servers a lane needs (cfg says which), runs fn,
// and stops them, also when fn fails or ctx ends.
func (l *lab) withServers(ctx context.Context, lane string, port int, cfg config, fn func(servers) error) (err error) {
	var srv servers
	if cfg.pg {
		t0 := time.Now()
		opts := []pgtemp.Option{}
		if port != 0 {
			opts = append(opts, pgtemp.WithPort(port))
			l.say("[%s] starting a temporary PostgreSQL cluster on 127.0.0.1:%d", lane, port)
		}
		if srv.cluster, err = pgtemp.Start(ctx, opts...); err != nil {
			return err
		}
		defer func() {
			l.say("[%s] stopping the PostgreSQL cluster", lane)
			err = errors.Join(err, srv.cluster.Stop())
		}()
		l.say("[%s] PostgreSQL %s up on port %d in %.1fs", lane, srv.cluster.Version(), srv.cluster.Port(), time.Since(t0).Seconds())
	}
	if cfg.etcd {
		t0 := time.Now()
		// The etcd server is this binary too, re-executed with the
		// etcd-server subcommand, so F8 can SIGKILL it and restart it.
		if srv.etcd, err = etcdtemp.Start(ctx, etcdtemp.WithArgs("etcd-server")); err != nil {
			return err
		}
		defer func() {
			l.say("[%s] stopping etcd", lane)
			err = errors.Join(err, srv.etcd.Stop())
		}()
		l.say("[%s] etcd %s up at %s in %.1fs", lane, srv.etcd.Version(), strings.Join(srv.etcd.Endpoints(), ","), time.Since(t0).Seconds())
	}
	return fn(srv)
}

// serve starts the cluster with empty databases and keeps it until ctx ends.
func (l *lab) serve(ctx context.Context) (err error) {
	cluster, err := pgtemp.Start(ctx, pgtemp.WithPort(l.port))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cluster.Stop()) }()
	for _, db := range []string{leaseDB, resourceDB} {
		if err := cluster.CreateDatabase(ctx, db); err != nil {
			return err
		}
	}
	l.say("PostgreSQL %s is up; Ctrl-C stops it and deletes its data", cluster.Version())
	l.say("lease database:  %s", cluster.DSN(leaseDB))
	l.say("report database: %s", cluster.DSN(resourceDB))
	<-ctx.Done()
	l.say("stopping the cluster")
	return nil
}

func (l *lab) runConfig(ctx context.Context, srv servers, cfg config) (limitsRow, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# leasefence lab: %s\n", cfg.title)
	var where []string
	if cfg.pg {
		// Recreate both databases: every configuration starts from nothing.
		for _, db := range []string{leaseDB, resourceDB} {
			if err := srv.cluster.CreateDatabase(ctx, db); err != nil {
				return limitsRow{Name: cfg.name}, err
			}
		}
		where = append(where, fmt.Sprintf("PostgreSQL %s on 127.0.0.1:%d, databases %s and %s",
			srv.cluster.Version(), srv.cluster.Port(), leaseDB, resourceDB))
	}
	if cfg.etcd {
		where = append(where, fmt.Sprintf("etcd %s at %s", srv.etcd.Version(), strings.Join(srv.etcd.Endpoints(), ",")))
	}
	where = append(where, fmt.Sprintf("%s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&buf, "# %s\n", strings.Join(where, "; "))
	nh := cfg.harness(srv)
	l.say("[%s] %s", cfg.name, cfg.title)
	sum, err := conformance.Report(ctx, &buf, nh, conformance.ReportOptions{
		Cases: l.cases,
		Progress: func(i, n int, r conformance.CaseResult, done bool) {
			// One whole line per event: lanes print at the same time.
			if !done {
				return
			}
			verdict := "ok"
			switch {
			case r.Failed > 0:
				verdict = "FAIL"
			case r.Skipped != "":
				verdict = "skipped: " + r.Skipped
			}
			l.say("[%s] (%d/%d) %s ... %s (passed=%d failed=%d, %.1fs)", cfg.name, i+1, n, r.Name, verdict, r.Passed, r.Failed, r.Elapsed.Seconds())
		},
	})
	row := newLimitsRow(cfg.name, buf.String(), sum.Passed, sum.Failed)
	path := filepath.Join(l.outDir, cfg.output)
	if werr := os.WriteFile(path, buf.Bytes(), 0o644); werr != nil {
		return row, errors.Join(err, werr)
	}
	if cfg.pictures {
		if perr := l.drawTimelines(sum, cfg); perr != nil {
			return row, errors.Join(err, perr)
		}
	}
	l.say("[%s] SUMMARY passed=%d failed=%d -> %s", cfg.name, sum.Passed, sum.Failed, path)
	return row, err
}

func (l *lab) say(format string, args ...any) {
	fmt.Fprintf(l.progress, "lab: "+format+"\n", args...)
}

// drawTimelines writes the recorded timelines of the paused-holder cases
// (F4, F5, and their user-data forms F4u, F4m) as SVG pictures.
func (l *lab) drawTimelines(sum conformance.Summary, cfg config) error {
	for _, r := range sum.Cases {
		var name, title string
		switch r.ID {
		case "F4":
			name, title = "f4-timeline.svg", "F4: paused stale holder against the fenced resource ("+cfg.title+")"
		case "F5":
			name, title = "f5-timeline.svg", "F5: the same timeline against the unfenced resource ("+cfg.title+")"
		case "F4u":
			name, title = "f4u-timeline.svg", "F4u: paused stale holder, the job's own tables in one fenced transaction ("+cfg.title+")"
		case "F4m":
			name, title = "f4m-timeline.svg", "F4m: the same timeline, marker first and rows second with no fence ("+cfg.title+")"
		default:
			continue
		}
		if len(r.Timeline) == 0 {
			continue // skipped or failed before anything happened
		}
		var buf bytes.Buffer
		if err := timeline.WriteSVG(&buf, title, r.Timeline); err != nil {
			return err
		}
		path := filepath.Join(l.outDir, name)
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			return err
		}
		l.say("[%s] %s timeline -> %s", cfg.name, r.ID, path)
	}
	return nil
}
