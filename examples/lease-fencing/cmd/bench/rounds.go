package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// variant is one measured operation. Exactly one of op and parallel is
// set. perOp divides the time of one op (a batch of 2 parts reports per
// part, 1000 renewals per lease).
type variant struct {
	name  string
	perOp int
	// op runs one operation, on the calling goroutine.
	op func() error
	// parallel is a concurrent variant: it runs b.N operations itself,
	// spread over several goroutines.
	parallel func(b *testing.B)
}

// bench runs the variant alone under Go's benchmark harness.
func (v variant) bench(b *testing.B) {
	if v.parallel != nil {
		v.parallel(b)
		return
	}
	for b.Loop() {
		if err := v.op(); err != nil {
			b.Fatal(err)
		}
	}
}

// ratio is one RATIO line: the median over rounds of the time per op of
// num divided by that of den, the two measured together in each round. An
// info ratio is measured the same way but reported as a comment line, not
// as a RATIO (the commit cost).
type ratio struct {
	name, num, den string
	info           bool
}

// ratios are the report's RATIO lines, in order. The concurrent variants
// compare throughput (ops/s): the inverse ratio of their ns/op, so their
// num and den are swapped.
var ratios = []ratio{
	{name: "fenced_write/unfenced_upsert", num: "fenced_write", den: "unfenced_upsert"},
	{name: "user_tx_fenced/user_tx_unfenced", num: "user_tx_fenced", den: "user_tx_unfenced"},
	{name: "pipeline_fenced/unfenced_upsert", num: "pipeline_fenced", den: "unfenced_upsert"},
	{name: "article_txn_fence/unfenced_upsert", num: "article_txn_fence", den: "unfenced_upsert"},
	{name: "batch2_per_part/unfenced_upsert", num: "batch2_per_part", den: "unfenced_upsert"},
	{name: "acquire/unfenced_upsert", num: "acquire", den: "unfenced_upsert"},
	{name: "renew/unfenced_upsert", num: "renew", den: "unfenced_upsert"},
	{name: "renew_1000_leases_per_lease/renew", num: "renew_1000_leases_per_lease", den: "renew"},
	{name: "fenced_8_scopes_8_clients/unfenced_8_clients", num: "unfenced_8_clients", den: "fenced_8_scopes_8_clients"},
	{name: "fenced_1_scope_8_clients/unfenced_8_clients", num: "unfenced_8_clients", den: "fenced_1_scope_8_clients"},
	{name: "fenced_64_scopes_64_clients/unfenced_64_clients", num: "unfenced_64_clients", den: "fenced_64_scopes_64_clients"},
	{name: "pipeline_fenced_64_scopes_64_clients/unfenced_64_clients", num: "unfenced_64_clients", den: "pipeline_fenced_64_scopes_64_clients"},
	{name: "etcd_guarded_txn/etcd_put", num: "etcd_guarded_txn", den: "etcd_put"},
	{name: "etcd_fenced_write/etcd_put", num: "etcd_fenced_write", den: "etcd_put"},
	{name: "etcd_acquire_release/etcd_mutex_lock_unlock", num: "etcd_acquire_release", den: "etcd_mutex_lock_unlock"},
	// Each fenced path against its limit: the unfenced write plus one
	// statement (etcd: one compare) in the same round trip and
	// transaction, the least any fence of that shape could cost (see
	// limitRead); for etcd's acquire+release, the Mutex's two requests with
	// the acquire's put only if the key is absent and the release's delete
	// only while the key is the holder's (one compare). All six compare
	// time per operation, the 8-client one too (unlike the other concurrent
	// ratios, which compare throughput): above 1 means the fence costs more
	// than its limit.
	{name: "fenced_write/fenced_write_limit", num: "fenced_write", den: "fenced_write_limit"},
	{name: "user_tx_fenced/user_tx_limit", num: "user_tx_fenced", den: "user_tx_limit"},
	// What RunTx's idle-in-transaction timeout costs it: its setting is one
	// more statement in BEGIN's round trip, which the limit does not have.
	{name: "user_tx_fenced/user_tx_fenced_no_idle", num: "user_tx_fenced", den: "user_tx_fenced_no_idle"},
	// The fence's own statements in the caller's transaction against the
	// limit, without that setting: RunTx with WithTimeouts(lock, 0), for a
	// caller whose role or database sets the idle timeout already.
	{name: "user_tx_fenced_no_idle/user_tx_limit", num: "user_tx_fenced_no_idle", den: "user_tx_limit"},
	{name: "pipeline_fenced/pipeline_limit", num: "pipeline_fenced", den: "pipeline_limit"},
	// What aborting costs: the pipeline's check must raise to stop the
	// write behind it, which a plain read cannot (see limitGuard); and the
	// fence against that aborting limit.
	{name: "pipeline_limit_guard/pipeline_limit", num: "pipeline_limit_guard", den: "pipeline_limit"},
	{name: "pipeline_fenced/pipeline_limit_guard", num: "pipeline_fenced", den: "pipeline_limit_guard"},
	{name: "fenced_8_scopes_8_clients/limit_8_scopes_8_clients", num: "fenced_8_scopes_8_clients", den: "limit_8_scopes_8_clients"},
	{name: "etcd_fenced_write/etcd_limit", num: "etcd_fenced_write", den: "etcd_limit"},
	{name: "etcd_acquire_release/etcd_acquire_release_limit", num: "etcd_acquire_release", den: "etcd_acquire_release_limit"},
	// What a durable commit costs in this run: a single-row upsert against
	// a round trip that commits nothing (see commitCost).
	{name: commitCostRatio, num: "unfenced_upsert", den: "select_1", info: true},
}

// commitCostRatio is the info ratio behind the report's "# commit cost:"
// line.
const commitCostRatio = "unfenced_upsert/select_1"

// unit is what a round runs at once: a ratio's two variants, or one
// variant that is in no ratio.
type unit struct {
	ratio   *ratio
	variant string
}

// roundUnits returns one unit per ratio and one per variant in no ratio.
func roundUnits(variants []variant, ratios []ratio) []unit {
	paired := map[string]bool{}
	var us []unit
	for i := range ratios {
		us = append(us, unit{ratio: &ratios[i]})
		paired[ratios[i].num], paired[ratios[i].den] = true, true
	}
	for _, v := range variants {
		if !paired[v.name] {
			us = append(us, unit{variant: v.name})
		}
	}
	return us
}

// sampler runs the rounds and keeps what they measured.
type sampler struct {
	ctx    context.Context
	say    func(string, ...any)
	rounds int
	byName map[string]variant
	// ns holds every counted time per op of a variant (ns, divided by
	// perOp); warm holds its warm-up run, whose allocation counts the
	// table reports (they do not depend on the machine's speed).
	ns   map[string][]float64
	warm map[string]testing.BenchmarkResult
	// perRatio holds each ratio's value of every round; pairs holds the
	// two times per op (num, den) it was computed from.
	perRatio map[string][]float64
	pairs    map[string][][2]float64
}

func newSampler(ctx context.Context, say func(string, ...any), rounds int, variants []variant) (*sampler, error) {
	s := &sampler{ctx: ctx, say: say, rounds: rounds, byName: map[string]variant{},
		ns: map[string][]float64{}, warm: map[string]testing.BenchmarkResult{}, perRatio: map[string][]float64{},
		pairs: map[string][][2]float64{}}
	for _, v := range variants {
		if (v.op == nil) == (v.parallel == nil) {
			return nil, fmt.Errorf("variant %s: exactly one of op and parallel must be set", v.name)
		}
		s.byName[v.name] = v
	}
	for _, r := range ratios {
		for _, name := range []string{r.num, r.den} {
			if _, ok := s.byName[name]; !ok {
				return nil, fmt.Errorf("ratio %s: no variant %s", r.name, name)
			}
		}
	}
	return s, nil
}

// run measures: round 0 runs every variant alone (warm-up: prepared
// statements, connections, caches; not counted, but its allocation counts
// are reported); each later round runs every unit once, units in a new
// random order.
//
// The machine is shared, and its disk and CPU change speed within
// seconds, so the two variants of a ratio are measured together:
//   - two single-goroutine variants alternate operation by operation
//     inside one harness run (A B, then B A, ...), each operation timed
//     on the monotonic clock, so both see the same machine;
//   - two concurrent variants run back to back, in a random order.
//
// A variant in several ratios (the baseline) is measured once per ratio.
func (s *sampler) run(variants []variant) error {
	for _, v := range variants {
		res, _, err := s.alone(0, v)
		if err != nil {
			return err
		}
		s.warm[v.name] = res
	}
	rng := rand.New(rand.NewPCG(1, 2))
	units := roundUnits(variants, ratios)
	for r := 1; r <= s.rounds; r++ {
		rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
		for _, u := range units {
			if u.ratio == nil {
				if _, _, err := s.alone(r, s.byName[u.variant]); err != nil {
					return err
				}
				continue
			}
			num, den := s.byName[u.ratio.num], s.byName[u.ratio.den]
			var a, b float64
			var err error
			if num.op != nil && den.op != nil {
				a, b, err = s.interleaved(r, num, den)
			} else {
				a, b, err = s.adjacent(r, num, den, rng.IntN(2) == 0)
			}
			if err != nil {
				return err
			}
			s.perRatio[u.ratio.name] = append(s.perRatio[u.ratio.name], a/b)
			s.pairs[u.ratio.name] = append(s.pairs[u.ratio.name], [2]float64{a, b})
		}
	}
	return nil
}

// alone runs v under the harness by itself and returns its harness result
// and its time per op, which it keeps in a counted round.
func (s *sampler) alone(round int, v variant) (testing.BenchmarkResult, float64, error) {
	if err := s.ctx.Err(); err != nil {
		return testing.BenchmarkResult{}, 0, err
	}
	res := testing.Benchmark(v.bench)
	if res.N == 0 {
		return res, 0, fmt.Errorf("variant %s failed (see above)", v.name)
	}
	ns := float64(res.T.Nanoseconds()) / float64(res.N) / float64(v.perOp)
	s.keep(round, v, ns)
	return res, ns, nil
}

// adjacent runs a and b alone, one right after the other (b first when
// bFirst), and returns their times per op.
func (s *sampler) adjacent(round int, a, b variant, bFirst bool) (float64, float64, error) {
	first, second := a, b
	if bFirst {
		first, second = b, a
	}
	_, x, err := s.alone(round, first)
	if err != nil {
		return 0, 0, err
	}
	_, y, err := s.alone(round, second)
	if err != nil {
		return 0, 0, err
	}
	if bFirst {
		x, y = y, x
	}
	return x, y, nil
}

// interleaved runs a and b alternately inside one harness run (see
// alternate) and returns their times per op.
func (s *sampler) interleaved(round int, a, b variant) (float64, float64, error) {
	per, err := alternate(s.ctx, a.op, b.op)
	if err != nil {
		return 0, 0, fmt.Errorf("variants %s and %s: %w", a.name, b.name, err)
	}
	x, y := per[0]/float64(a.perOp), per[1]/float64(b.perOp)
	s.keep(round, a, x)
	s.keep(round, b, y)
	return x, y, nil
}

// alternate runs the ops in turn inside one harness run, each iteration
// starting with the next one (A B, B A, ... for two), and returns each
// op's mean time in ns. Each op is timed on the monotonic clock (about
// 50 ns per reading, against operations of hundreds of µs), so all ops
// see the same moments of the machine.
func alternate(ctx context.Context, ops ...func() error) ([]float64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sums := make([]time.Duration, len(ops))
	var n int
	res := testing.Benchmark(func(b *testing.B) {
		clear(sums) // the harness calls this with growing b.N; keep the last
		n = 0
		for b.Loop() {
			for k := range ops {
				i := (k + n) % len(ops)
				start := time.Now()
				if err := ops[i](); err != nil {
					b.Fatal(err)
				}
				sums[i] += time.Since(start)
			}
			n++
		}
	})
	if res.N == 0 || n == 0 {
		return nil, errors.New("an operation failed (see above)")
	}
	per := make([]float64, len(ops))
	for i, d := range sums {
		per[i] = float64(d.Nanoseconds()) / float64(n)
	}
	return per, nil
}

// keep records a time per op of v, unless round is the warm-up.
func (s *sampler) keep(round int, v variant, ns float64) {
	s.say("round %d/%d %-32s %10.0f ns/op", round, s.rounds, v.name, ns)
	if round > 0 {
		s.ns[v.name] = append(s.ns[v.name], ns)
	}
}

// stats returns the median, minimum and maximum of xs (all 0 when empty).
func stats(xs []float64) (med, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	return median(xs), slices.Min(xs), slices.Max(xs)
}

// quartiles returns the minimum, first quartile, median, third quartile
// and maximum of xs (quartiles as medians of the lower and upper halves);
// all 0 when xs is empty.
func quartiles(xs []float64) [5]float64 {
	if len(xs) == 0 {
		return [5]float64{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	half := len(s) / 2
	lower, upper := s[:half], s[len(s)-half:]
	if half == 0 {
		lower, upper = s, s
	}
	return [5]float64{s[0], median(lower), median(s), median(upper), s[len(s)-1]}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
