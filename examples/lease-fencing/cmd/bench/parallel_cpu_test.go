package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestParallelCPU measures the CPU time per write of concurrent PostgreSQL
// variants (unfenced_8_clients, fenced_8_scopes_8_clients and
// limit_8_scopes_8_clients unless -parallel-cpu-variants says otherwise):
// each round runs every variant once under Go's benchmark harness, in a
// new order, and reads the CPU time of this process (the client) and of
// the pool's PostgreSQL backends (the server) around it. With 8 clients on
// 2 CPUs the machine is CPU-bound, so throughput follows CPU per write;
// this says whose CPU a ratio's gap is. Where a variant leaves CPU idle,
// the rest says what its writes wait for: the cluster's WAL syncs per write
// (pg_stat_wal), and the pool's backends by state, sampled from
// pg_stat_activity every millisecond on a connection of its own while the
// variant runs (running, idle, or the wait event: IO:WALSync is a commit's
// flush, LWLock:WALWrite a commit waiting for another's flush to carry it).
// The sampling costs the server the same during every variant, but on 2
// CPUs it moves the ratios: read them from the bench. It checks nothing and
// runs only when -parallel-cpu-rounds is set (docs/performance.md, "Where
// the goals stand"):
//
//	go test -c -o /tmp/pcpu/bench.test ./cmd/bench/
//	/tmp/pcpu/bench.test -test.run '^TestParallelCPU$' -test.v -parallel-cpu-rounds 10
var (
	parallelCPURounds   = flag.Int("parallel-cpu-rounds", 0, "rounds of TestParallelCPU; 0: TestParallelCPU is skipped")
	parallelCPUWaits    = flag.Bool("parallel-cpu-waits", true, "TestParallelCPU: sample the backends' wait events while each variant runs (costs CPU)")
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
	waits := make([]*waitTally, len(names))
	for i := range waits {
		waits[i] = &waitTally{states: map[string]int{}}
	}
	for r := range *parallelCPURounds {
		for k := range names {
			i := (k + r) % len(names)
			// The CPU time covers the harness's calibration runs too: divide
			// it by the writes of all of them.
			all := 0
			syncs0 := walSyncs(ctx, t, e.par)
			stop := func() {}
			if *parallelCPUWaits {
				stop = sampleWaits(ctx, t, e.par.Config().ConnConfig, pids, waits[i])
			}
			c0, s0 := selfCPU(), procCPU(pids)
			res := testing.Benchmark(func(b *testing.B) { all += b.N; byName[names[i]].bench(b) })
			c1, s1 := selfCPU(), procCPU(pids)
			stop()
			syncs1 := walSyncs(ctx, t, e.par)
			waits[i].writes += int64(all)
			waits[i].syncs += syncs1 - syncs0
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
	for i, n := range names {
		t.Logf("%-28s %s", n, waits[i])
	}
}

// waitTally counts, over samples of pg_stat_activity, the pool's backends
// in each state: "running" (active, no wait event), "idle" (waiting for the
// client) or the wait event of an active one.
type waitTally struct {
	samples int
	states  map[string]int
	// writes done, calibration runs included, and the cluster's WAL syncs
	// (pg_stat_wal) counted around them
	writes, syncs int64
}

// String gives the average number of backends in each state per sample,
// the most frequent first.
func (w *waitTally) String() string {
	type kv struct {
		k string
		n int
	}
	var kvs []kv
	for k, n := range w.states {
		kvs = append(kvs, kv{k, n})
	}
	slices.SortFunc(kvs, func(a, b kv) int { return cmp.Compare(b.n, a.n) })
	var b strings.Builder
	fmt.Fprintf(&b, "writes per WAL sync %.2f; backends by state, mean of %d samples:",
		float64(w.writes)/float64(max(w.syncs, 1)), w.samples)
	for _, e := range kvs {
		fmt.Fprintf(&b, " %s %.2f", e.k, float64(e.n)/float64(max(w.samples, 1)))
	}
	return b.String()
}

// walSyncs reads the cluster's WAL syncs so far (pg_stat_wal). A backend
// reports its counts at most once a second, and within a second of going
// idle: the wait before the read lets the variant's backends report all of
// theirs.
func walSyncs(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (syncs int64) {
	time.Sleep(1100 * time.Millisecond)
	if err := pool.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&syncs); err != nil {
		t.Fatal(err)
	}
	return syncs
}

// sampleWaits polls pg_stat_activity for pids every millisecond on a
// connection of its own, adding to w, until the returned stop is called.
// The polling backend costs the server the same during every variant.
func sampleWaits(ctx context.Context, t *testing.T, cc *pgx.ConnConfig, pids []int, w *waitTally) (stop func()) {
	conn, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rows, err := conn.Query(ctx, `SELECT state, coalesce(wait_event_type || ':' || wait_event, '')
  FROM pg_stat_activity WHERE pid = ANY($1)`, pids)
			if err != nil {
				return
			}
			w.samples++
			for rows.Next() {
				var state, wait string
				if rows.Scan(&state, &wait) != nil {
					break
				}
				switch {
				case state == "idle":
					w.states["idle"]++
				case wait == "":
					w.states["running"]++
				default:
					w.states[wait]++
				}
			}
			rows.Close()
			time.Sleep(time.Millisecond)
		}
	}()
	return func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	}
}
