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
	"sync/atomic"
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
	sets     int // server sets per lane, each taking a share of its cases
	progress io.Writer
}

// configRun is one configuration's run: its cases, which the lane's server
// sets take one at a time, and what each case printed.
type configRun struct {
	cfg   config
	ids   []string
	next  atomic.Int64 // index in ids of the next case to take
	cases []caseOutput // by index in ids
	where []string     // by server set: the servers it ran cases on
}

// caseOutput is what one case printed (nil: it did not run) and returned,
// and on which server set.
type caseOutput struct {
	set  int
	text []byte
	res  conformance.CaseResult
}

// run runs every selected configuration, each lane on server sets of its
// own, and writes one output file per configuration and LIMITS.md. It
// returns the number of failed checks.
//
// Each set of servers takes the next case of its lane not yet taken, one
// conformance.Report call per case, and the configuration's output file
// puts the cases back in the suite's order. With more than one set per
// lane (-sets) a lane's cases run side by side, each on one set from
// beginning to end, as it would alone: no two cases share a server, and a
// crash case (F8) never touches another case's server. Most of a case's
// time is waiting (a paused holder's TTL running out, a crash's
// recovery), so two sets halve the lab's wall time; but the default is
// one: on two CPUs beside two CPU burners, twelve cases at once delayed
// PostgreSQL renewals past the suite's 1.5 s TTLs and failed timing
// checks in five of six runs, ten at once in two of two, where six at
// once passed three of three (docs/lab.md).
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
	ids := l.cases
	if len(ids) == 0 {
		ids = conformance.CaseIDs()
	}
	sets := max(l.sets, 1)

	var lanes []string
	runs := make([]*configRun, len(selected))
	for i, c := range selected {
		if !slices.Contains(lanes, c.lane) {
			lanes = append(lanes, c.lane)
		}
		runs[i] = &configRun{cfg: c, ids: ids, cases: make([]caseOutput, len(ids)), where: make([]string, sets)}
	}
	started := time.Now().UTC()
	errs := make([]error, len(lanes)*sets)
	var pgVersion string
	var wg sync.WaitGroup
	for li, lane := range lanes {
		var laneRuns []*configRun
		for _, r := range runs {
			if r.cfg.lane == lane {
				laneRuns = append(laneRuns, r)
			}
		}
		for set := range sets {
			wg.Go(func() {
				// The PostgreSQL lane's first set gets the lab's fixed
				// port; every other cluster takes a free one.
				port := 0
				if lane == "postgres" && set == 0 {
					port = l.port
				}
				name := lane
				if sets > 1 {
					name = fmt.Sprintf("%s/%d", lane, set+1)
				}
				errs[li*sets+set] = l.withServers(ctx, name, port, laneRuns[0].cfg, func(srv servers) error {
					if port != 0 && srv.cluster != nil {
						pgVersion = srv.cluster.Version()
					}
					for _, r := range laneRuns {
						if err := l.runShare(ctx, srv, set, r); err != nil {
							return fmt.Errorf("%s: %w", name, err)
						}
					}
					return nil
				})
			})
		}
	}
	wg.Wait()
	rows := make([]limitsRow, len(runs))
	for i, r := range runs {
		var werr error
		rows[i], werr = l.writeConfig(r, started)
		errs = append(errs, werr)
		failed += rows[i].Failed
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
		srv.cluster, err = pgtemp.Start(ctx, opts...)
		if errors.Is(err, pgtemp.ErrPortInUse) {
			// The lab's other lanes connect at the same time, and the
			// kernel picks their local ports from a range that holds the
			// fixed one: it may be one of theirs. The lanes need no fixed
			// port (the evidence names none), so take any.
			l.say("[%s] port %d is in use (%v); taking a free port instead", lane, port, err)
			srv.cluster, err = pgtemp.Start(ctx)
		}
		if err != nil {
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

// runShare runs cases of r on one server set until none is left to take:
// it recreates the configuration's databases on the set's cluster (every
// configuration starts from nothing), then takes the next case not yet
// taken by any set, one at a time.
func (l *lab) runShare(ctx context.Context, srv servers, set int, r *configRun) error {
	cfg := r.cfg
	var where []string
	if cfg.pg {
		for _, db := range []string{leaseDB, resourceDB} {
			if err := srv.cluster.CreateDatabase(ctx, db); err != nil {
				return err
			}
		}
		where = append(where, fmt.Sprintf("PostgreSQL %s on 127.0.0.1:%d, databases %s and %s",
			srv.cluster.Version(), srv.cluster.Port(), leaseDB, resourceDB))
	}
	if cfg.etcd {
		where = append(where, fmt.Sprintf("etcd %s at %s", srv.etcd.Version(), strings.Join(srv.etcd.Endpoints(), ",")))
	}
	r.where[set] = strings.Join(where, ", ")
	nh := cfg.harness(srv)
	for {
		i := int(r.next.Add(1)) - 1
		if i >= len(r.ids) {
			return nil
		}
		var buf bytes.Buffer
		sum, err := conformance.Report(ctx, &buf, nh, conformance.ReportOptions{Cases: r.ids[i : i+1]})
		if err != nil {
			return err
		}
		// Each call ends with its own SUMMARY line; the output file has
		// one, for the whole configuration (writeConfig).
		summary := fmt.Sprintf("SUMMARY passed=%d failed=%d\n", sum.Passed, sum.Failed)
		text, ok := bytes.CutSuffix(buf.Bytes(), []byte(summary))
		if !ok || len(sum.Cases) != 1 {
			return fmt.Errorf("%s: case %s: the report did not end with %q", cfg.name, r.ids[i], strings.TrimSpace(summary))
		}
		res := sum.Cases[0]
		r.cases[i] = caseOutput{set: set, text: text, res: res}
		verdict := "ok"
		switch {
		case res.Failed > 0:
			verdict = "FAIL"
		case res.Skipped != "":
			verdict = "skipped: " + res.Skipped
		}
		// One whole line per event: lanes and sets print at the same time.
		where := ""
		if len(r.where) > 1 {
			where = fmt.Sprintf(", server set %d", set+1)
		}
		l.say("[%s] (%d/%d) %s ... %s (passed=%d failed=%d, %.1fs%s)",
			cfg.name, i+1, len(r.ids), res.Name, verdict, res.Passed, res.Failed, res.Elapsed.Seconds(), where)
	}
}

// writeConfig writes r's output file: a header naming the server sets,
// every case's lines in the suite's order, each after a line saying which
// set ran it, and one SUMMARY line for them all. It draws F4's and F5's
// timelines when the configuration is the one that does.
func (l *lab) writeConfig(r *configRun, started time.Time) (limitsRow, error) {
	cfg := r.cfg
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# leasefence lab: %s\n", cfg.title)
	var servers string
	if len(r.where) == 1 {
		servers = r.where[0]
	} else {
		var sets []string
		for i, w := range r.where {
			if w != "" {
				sets = append(sets, fmt.Sprintf("set %d: %s", i+1, w))
			}
		}
		servers = fmt.Sprintf("%d server sets, each case run on one from its beginning to its end: %s", len(sets), strings.Join(sets, "; "))
	}
	fmt.Fprintf(&buf, "# %s; %s %s/%s; %s\n", servers, runtime.Version(), runtime.GOOS, runtime.GOARCH, started.Format(time.RFC3339))
	var sum conformance.Summary
	var missing []string
	for i, c := range r.cases {
		if c.text == nil {
			missing = append(missing, r.ids[i])
			continue
		}
		if len(r.where) > 1 {
			fmt.Fprintf(&buf, "# server set %d\n", c.set+1)
		}
		buf.Write(c.text)
		sum.Passed += c.res.Passed
		sum.Failed += c.res.Failed
		sum.Cases = append(sum.Cases, c.res)
	}
	fmt.Fprintf(&buf, "SUMMARY passed=%d failed=%d\n", sum.Passed, sum.Failed)
	row := newLimitsRow(cfg.name, buf.String(), sum.Passed, sum.Failed)
	var err error
	if len(missing) > 0 {
		err = fmt.Errorf("%s: cases not run: %s", cfg.name, strings.Join(missing, ", "))
	}
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
