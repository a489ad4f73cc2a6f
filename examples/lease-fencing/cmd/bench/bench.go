package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
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
}

// variant is one measured operation. perOp divides ns/op (a batch of 2
// parts reports per part, 1000 renewals per lease).
type variant struct {
	name  string
	perOp int
	bench func(b *testing.B)
}

// measurement is one variant's medians over the rounds.
type measurement struct {
	name    string
	nsPerOp float64 // median
	spread  [2]float64
	allocs  int64
	bytes   int64
	rounds  int
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
	fmt.Fprintf(w, "# %d rounds after a warm-up, variants in a new random order each round; table: median per variant;\n", cfg.rounds)
	fmt.Fprintf(w, "# RATIO: median over rounds of the ratio within a round (two variants of this run, never of two runs)\n\n")

	// Round 0 warms up (prepared statements, connections, caches) and is
	// not counted. Every round runs all variants in a new random order, so
	// a slow phase of the machine does not always hit the same variant;
	// each ratio is taken within a round and the median over rounds is
	// reported, which a drifting machine disturbs less than a ratio of
	// medians.
	results := map[string][]testing.BenchmarkResult{}
	perRound := make([]map[string]float64, 0, cfg.rounds)
	rng := rand.New(rand.NewPCG(1, 2))
	order := slices.Clone(variants)
	for r := 0; r <= cfg.rounds; r++ {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		round := map[string]float64{}
		for _, v := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			res := testing.Benchmark(v.bench)
			if res.N == 0 {
				return fmt.Errorf("variant %s failed (see above)", v.name)
			}
			ns := float64(res.T.Nanoseconds()) / float64(res.N) / float64(v.perOp)
			say("round %d/%d %-32s %10.0f ns/op", r, cfg.rounds, v.name, ns)
			if r == 0 {
				continue
			}
			results[v.name] = append(results[v.name], res)
			round[v.name] = ns
		}
		if r > 0 {
			perRound = append(perRound, round)
		}
	}
	ms := map[string]measurement{}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tmedian µs/op\tmin\tmax\tallocs/op\tB/op\t")
	for _, v := range variants {
		m := summarize(v, results[v.name])
		ms[v.name] = m
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%d\t%d\t\n", v.name, m.nsPerOp/1e3, m.spread[0]/1e3, m.spread[1]/1e3, m.allocs, m.bytes)
	}
	tw.Flush()

	scale, err := env.scaling(ctx, cfg.scaling, say)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n# latency with many existing leases / scopes (median of %d rounds, µs/op)\n", scale.rounds)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "existing\tacquire+release\tfenced write\t")
	for _, row := range scale.rows {
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t\n", row.n, row.acquire/1e3, row.write/1e3)
	}
	tw.Flush()

	fmt.Fprintln(w)
	ratio := func(name, num, den string) {
		var rs []float64
		for _, round := range perRound {
			if a, b := round[num], round[den]; a > 0 && b > 0 {
				rs = append(rs, a/b)
			}
		}
		if len(rs) == 0 {
			return
		}
		fmt.Fprintf(w, "RATIO %s %.2f\n", name, median(rs))
	}
	ratio("fenced_write/unfenced_upsert", "fenced_write", "unfenced_upsert")
	ratio("article_txn_fence/unfenced_upsert", "article_txn_fence", "unfenced_upsert")
	ratio("batch2_per_part/unfenced_upsert", "batch2_per_part", "unfenced_upsert")
	ratio("acquire/unfenced_upsert", "acquire", "unfenced_upsert")
	ratio("renew/unfenced_upsert", "renew", "unfenced_upsert")
	ratio("renew_1000_leases_per_lease/renew", "renew_1000_leases_per_lease", "renew")
	// The concurrent variants compare throughput (ops/s): the inverse ratio
	// of their ns/op.
	ratio("fenced_8_scopes_8_clients/unfenced_8_clients", "unfenced_8_clients", "fenced_8_scopes_8_clients")
	ratio("fenced_1_scope_8_clients/unfenced_8_clients", "unfenced_8_clients", "fenced_1_scope_8_clients")
	ratio("etcd_fenced_write/etcd_put", "etcd_fenced_write", "etcd_put")
	ratio("etcd_acquire_release/etcd_mutex_lock_unlock", "etcd_acquire_release", "etcd_mutex_lock_unlock")
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

// summarize takes the median ns/op over the rounds (per op as the variant
// defines it) and the allocations of the median round.
func summarize(v variant, rs []testing.BenchmarkResult) measurement {
	per := func(r testing.BenchmarkResult) float64 {
		return float64(r.T.Nanoseconds()) / float64(r.N) / float64(v.perOp)
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b testing.BenchmarkResult) int {
		switch pa, pb := per(a), per(b); {
		case pa < pb:
			return -1
		case pa > pb:
			return 1
		}
		return 0
	})
	med := sorted[len(sorted)/2]
	m := measurement{name: v.name, nsPerOp: per(med), spread: [2]float64{per(sorted[0]), per(sorted[len(sorted)-1])},
		allocs: med.AllocsPerOp(), bytes: med.AllocedBytesPerOp(), rounds: len(rs)}
	if len(sorted)%2 == 0 {
		m.nsPerOp = (per(sorted[len(sorted)/2-1]) + per(med)) / 2
	}
	return m
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
