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
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/examples/lease-fencing/internal/timeline"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// The lab's two databases, as in the article: lease state and resource
// state on one temporary cluster, apart so the resource cannot read the
// lease table by accident.
const (
	leaseDB    = "lease26"
	resourceDB = "res26"
)

// config is one backend configuration the lab runs the suite on.
type config struct {
	name   string // as given to -configs
	output string // file name under the output directory
	title  string
	driver string
	// pictures: draw F4's and F5's timelines from this configuration's run.
	pictures bool
}

var allConfigs = []config{
	{"pgx", "output-pg.txt", "PostgreSQL, lease and resource, pgx/v5", pgconformance.DriverPgx, true},
	{"libpq", "output-pg-libpq.txt", "PostgreSQL, lease and resource, lib/pq (database/sql)", pgconformance.DriverLibpq, false},
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

	l.say("starting a temporary PostgreSQL cluster on 127.0.0.1:%d", l.port)
	t0 := time.Now()
	cluster, err := pgtemp.Start(ctx, pgtemp.WithPort(l.port))
	if err != nil {
		return 0, err
	}
	defer func() {
		l.say("stopping the cluster")
		err = errors.Join(err, cluster.Stop())
	}()
	l.say("cluster up in %.1fs: PostgreSQL %s", time.Since(t0).Seconds(), cluster.Version())

	var rows []limitsRow
	for _, cfg := range selected {
		row, err := l.runConfig(ctx, cluster, cfg)
		failed += row.Failed
		rows = append(rows, row)
		if err != nil {
			return failed, err
		}
	}
	return failed, l.writeLimits(cluster.Version(), rows)
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

func (l *lab) runConfig(ctx context.Context, cluster *pgtemp.Cluster, cfg config) (limitsRow, error) {
	// Recreate both databases: every configuration starts from nothing.
	for _, db := range []string{leaseDB, resourceDB} {
		if err := cluster.CreateDatabase(ctx, db); err != nil {
			return limitsRow{Name: cfg.name}, err
		}
	}
	nh := pgconformance.New(pgconformance.Config{
		Driver:      cfg.driver,
		LeaseDSN:    cluster.DSN(leaseDB),
		ResourceDSN: cluster.DSN(resourceDB),
		HolderArgs:  []string{"holder"}, // main runs the holder for this subcommand
		Cluster:     cluster,            // F8 crashes it
	})

	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# leasefence lab: %s\n", cfg.title)
	fmt.Fprintf(&buf, "# PostgreSQL %s on 127.0.0.1:%d, databases %s and %s; %s %s/%s; %s\n",
		cluster.Version(), l.port, leaseDB, resourceDB, runtime.Version(), runtime.GOOS, runtime.GOARCH,
		time.Now().UTC().Format(time.RFC3339))
	l.say("[%s] %s", cfg.name, cfg.title)
	sum, err := conformance.Report(ctx, &buf, nh, conformance.ReportOptions{
		Cases: l.cases,
		Progress: func(i, n int, r conformance.CaseResult, done bool) {
			if !done {
				fmt.Fprintf(l.progress, "lab: [%s] (%d/%d) %s ... ", cfg.name, i+1, n, r.Name)
				return
			}
			verdict := "ok"
			switch {
			case r.Failed > 0:
				verdict = "FAIL"
			case r.Skipped != "":
				verdict = "skipped: " + r.Skipped
			}
			fmt.Fprintf(l.progress, "%s (passed=%d failed=%d, %.1fs)\n", verdict, r.Passed, r.Failed, r.Elapsed.Seconds())
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

// drawTimelines writes F4's and F5's recorded timelines as SVG pictures.
func (l *lab) drawTimelines(sum conformance.Summary, cfg config) error {
	for _, r := range sum.Cases {
		var name, title string
		switch r.ID {
		case "F4":
			name, title = "f4-timeline.svg", "F4: paused stale holder against the fenced resource ("+cfg.title+")"
		case "F5":
			name, title = "f5-timeline.svg", "F5: the same timeline against the unfenced resource ("+cfg.title+")"
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
