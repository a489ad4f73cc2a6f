package main

import (
	"flag"
	"strings"
	"testing"
)

// TestParallelCPU measures the CPU time per write of concurrent PostgreSQL
// variants (unfenced_8_clients, fenced_8_scopes_8_clients and
// limit_8_scopes_8_clients unless -parallel-cpu-variants says otherwise):
// each round runs every variant once under Go's benchmark harness, in a
// new order, and reads the CPU time of this process (the client) and of
// the pool's PostgreSQL backends (the server) around it. With 8 clients on
// 2 CPUs the machine is CPU-bound, so throughput follows CPU per write;
// this says whose CPU a ratio's gap is. It checks nothing and runs only
// when -parallel-cpu-rounds is set (docs/performance.md, "Where the goals
// stand"):
//
//	go test -c -o /tmp/pcpu/bench.test ./cmd/bench/
//	/tmp/pcpu/bench.test -test.run '^TestParallelCPU$' -test.v -parallel-cpu-rounds 10
var (
	parallelCPURounds   = flag.Int("parallel-cpu-rounds", 0, "rounds of TestParallelCPU; 0: TestParallelCPU is skipped")
	parallelCPUVariants = flag.String("parallel-cpu-variants", "unfenced_8_clients,fenced_8_scopes_8_clients,limit_8_scopes_8_clients",
		"concurrent PostgreSQL variants TestParallelCPU measures, comma-separated")
)

func TestParallelCPU(t *testing.T) {
	if *parallelCPURounds <= 0 {
		t.Skip("set -parallel-cpu-rounds to run it")
	}
	ctx := t.Context()
	e, err := startPG(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.close(); err != nil {
			t.Error(err)
		}
	}()
	vs, err := e.pgVariants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]variant{}
	for _, v := range vs {
		byName[v.name] = v
	}
	names := strings.Split(*parallelCPUVariants, ",")
	for _, n := range names {
		if v, ok := byName[n]; !ok || v.parallel == nil {
			t.Fatalf("-parallel-cpu-variants: %q is no concurrent PostgreSQL variant", n)
		}
	}
	pids, err := poolBackends(ctx, e.par)
	if err != nil {
		t.Fatal(err)
	}
	wall, client, server := make([][]float64, len(names)), make([][]float64, len(names)), make([][]float64, len(names))
	for r := range *parallelCPURounds {
		for k := range names {
			i := (k + r) % len(names)
			// The CPU time covers the harness's calibration runs too: divide
			// it by the writes of all of them.
			all := 0
			c0, s0 := selfCPU(), procCPU(pids)
			res := testing.Benchmark(func(b *testing.B) { all += b.N; byName[names[i]].bench(b) })
			c1, s1 := selfCPU(), procCPU(pids)
			wall[i] = append(wall[i], float64(res.T.Nanoseconds())/float64(res.N)/1e3)
			client[i] = append(client[i], float64((c1-c0).Nanoseconds())/float64(all)/1e3)
			server[i] = append(server[i], float64((s1-s0).Nanoseconds())/float64(all)/1e3)
		}
	}
	for i, n := range names {
		w, c, s := quartiles(wall[i]), quartiles(client[i]), quartiles(server[i])
		t.Logf("%-28s wall µs/write median %.1f (%.1f-%.1f), client CPU %.1f (%.1f-%.1f), server CPU %.1f (%.1f-%.1f), both %.1f",
			n, w[2], w[1], w[3], c[2], c[1], c[3], s[2], s[1], s[3], c[2]+s[2])
	}
}
