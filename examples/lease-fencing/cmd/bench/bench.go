package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

type config struct {
	stdout  io.Writer // the report; also written to out/latest.txt
	rounds  int
	out     string
	lab     string
	scaling string
	docs    string
	// handoffSamples is the number of handoff samples per variant,
	// handoffPollSamples the 2 s poller's (a few seconds each),
	// handoffMembers the campaigners of each variant's lease.
	handoffSamples, handoffPollSamples, handoffMembers int
}

func run(ctx context.Context, cfg config) (err error) {
	var report bytes.Buffer
	w := io.MultiWriter(cfg.stdout, &report)
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...) }

	env, err := startEnv(ctx, say)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.close()) }()

	variants, err := env.variants(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "# leasefence bench, %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "# %s %s/%s, %d CPUs; %s; durability on (fsync, synchronous_commit, etcd WAL fsync)\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), env.describe())
	fmt.Fprintf(w, "# %d rounds after a warm-up; each round measures every ratio's two variants together: single-client ones alternate\n", cfg.rounds)
	fmt.Fprintf(w, "# op by op in one harness run, concurrent ones run back to back; pairs in a new random order each round\n")
	fmt.Fprintf(w, "# table: median, min, max over all runs of a variant (a baseline runs once per ratio), allocations per call (a batch, a RenewAll) from the warm-up;\n")
	fmt.Fprintf(w, "# RATIO: median over rounds of the ratio measured within the round (two variants of this run, never of two runs);\n")
	fmt.Fprintf(w, "# the N-client ratios compare throughput (above 1: the fenced side is faster), but every ratio to a limit variant (the unfenced\n")
	fmt.Fprintf(w, "# write plus one statement, for etcd one compare, in the same round trip and transaction; for etcd's acquire+release, the Mutex's\n")
	fmt.Fprintf(w, "# two requests with a compare each) compares time per write: above 1, the fence costs more\n\n")

	smp, err := newSampler(ctx, say, cfg.rounds, variants)
	if err != nil {
		return err
	}
	if err := smp.run(variants); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tmedian µs/op\tmin\tmax\truns\tallocs/call\tB/call\t")
	for _, v := range variants {
		med, lo, hi := stats(smp.ns[v.name])
		warm := smp.warm[v.name]
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d\t\n", v.name, med/1e3, lo/1e3, hi/1e3, len(smp.ns[v.name]),
			warm.AllocsPerOp(), warm.AllocedBytesPerOp())
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, commitCost(smp.pairs[commitCostRatio], cfg.rounds))

	scale, err := env.scaling(ctx, cfg.scaling, say)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n# latency with many existing leases / scopes: the sizes alternate op by op in one harness run\n")
	fmt.Fprintf(w, "# (median of %d rounds, µs/op; ratio: to the smallest size, within the round)\n", scale.rounds)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "existing\tacquire+release\tratio\tfenced write\tratio\t")
	for _, row := range scale.rows {
		fmt.Fprintf(tw, "%d\t%.1f\t%.2f\t%.1f\t%.2f\t\n", row.n, row.acquire/1e3, row.acquireRatio, row.write/1e3, row.writeRatio)
	}
	tw.Flush()

	handoff, err := env.handoff(ctx, cfg.handoffSamples, cfg.handoffPollSamples, cfg.handoffMembers, say)
	if err != nil {
		return err
	}

	// How much each ratio moved from round to round: the spread a single
	// round would have shown.
	fmt.Fprintf(w, "\n# each ratio over the %d rounds: quartiles and extremes\n", cfg.rounds)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ratio\tmin\tq1\tmedian\tq3\tmax\t")
	for _, r := range ratios {
		if r.info {
			continue
		}
		q := quartiles(smp.perRatio[r.name])
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", r.name, q[0], q[1], q[2], q[3], q[4])
	}
	tw.Flush()

	handoff.print(w)

	fmt.Fprintln(w)
	for _, r := range ratios {
		if r.info {
			continue
		}
		fmt.Fprintf(w, "RATIO %s %.2f\n", r.name, median(smp.perRatio[r.name]))
	}
	handoff.ratioLines(w)
	if cfg.lab != "" {
		secs, err := timeLab(ctx, cfg.lab, say)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "RATIO lab_wall_seconds %.2f\n", secs)
	}
	if cfg.out != "" {
		if err := os.MkdirAll(cfg.out, 0o755); err != nil {
			return err
		}
		path := filepath.Join(cfg.out, "latest.txt")
		if err := os.WriteFile(path, report.Bytes(), 0o644); err != nil {
			return err
		}
		say("report written to %s", path)
	}
	if cfg.docs != "" {
		if err := updateDocs(cfg.docs, report.String()); err != nil {
			return err
		}
		say("bench section of %s updated", cfg.docs)
	}
	return nil
}

// commitCost is the report's "# commit cost:" comment: what a durable
// single-row upsert (a round trip, one row written, one commit with its WAL
// flush) and a SELECT 1 (a round trip, nothing written or committed) took,
// measured together op by op in each round. Their difference is mostly the
// commit's fsync; the fence adds CPU and round trips, not fsyncs, so the
// faster the commit in a run, the larger that run's fenced/unfenced ratios.
func commitCost(pairs [][2]float64, rounds int) string {
	var upsert, sel, diff []float64
	for _, p := range pairs {
		upsert, sel, diff = append(upsert, p[0]), append(sel, p[1]), append(diff, p[0]-p[1])
	}
	q := quartiles(diff)
	return fmt.Sprintf("# commit cost: durable single-row upsert %.1f µs, SELECT 1 round trip %.1f µs (medians of %d rounds, the two\n"+
		"# alternating op by op); upsert minus SELECT 1, i.e. the row write and the durable commit (WAL flush, fsync):\n"+
		"# median %.1f µs, quartiles %.1f-%.1f, range %.1f-%.1f. The fence adds CPU and round trips, not fsyncs: the\n"+
		"# cheaper the commit in a run, the larger that run's fenced/unfenced ratios.",
		median(upsert)/1e3, median(sel)/1e3, rounds, q[2]/1e3, q[1]/1e3, q[3]/1e3, q[0]/1e3, q[4]/1e3)
}

// updateDocs replaces the text between the bench markers of a markdown
// file with this run's report, so the document shows the last run's
// numbers without anyone copying them by hand.
func updateDocs(path, report string) error {
	const begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s section", path, begin, end)
	}
	s = s[:i+len(begin)] + "\n```\n" + report + "```\n" + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// timeLab runs the whole lab once (cluster start included), writing its
// evidence to a temporary directory, and returns its wall time.
func timeLab(ctx context.Context, script string, say func(string, ...any)) (float64, error) {
	tmp, err := os.MkdirTemp("", "bench-lab-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	say("timing the whole lab: %s -out %s", script, tmp)
	start := time.Now()
	cmd := exec.CommandContext(ctx, script, "-out", tmp)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("lab: %w", err)
	}
	return time.Since(start).Seconds(), nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-scaling: bad size %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}
