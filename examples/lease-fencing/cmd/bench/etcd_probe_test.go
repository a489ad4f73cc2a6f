package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
)

// TestEtcdProbe measures a few single-client etcd variants (the bench's
// and the probe's own, probeOwnVariants) on one etcd server, without
// PostgreSQL and without the rest of the bench: each round alternates them
// op by op in one harness run (see alternate), as the bench's rounds do for
// a ratio's two variants, and the report gives, for every pair of them, the
// median and quartiles over rounds of the ratio of their times per op in
// the same round, and each variant's allocations per op. It checks nothing
// and runs only when -probe-rounds is set (docs/performance.md, "etcd
// acquire+release"):
//
//	go test -c -o /tmp/probe/bench.test ./cmd/bench/
//	/tmp/probe/bench.test -test.run '^TestEtcdProbe$' -test.v -test.benchtime 300ms \
//	    -probe-rounds 40 -probe-variants etcd_acquire_release,etcd_mutex_lock_unlock
//
// The round's log line gives each variant's time per op relative to the
// last one named.
var (
	probeRounds   = flag.Int("probe-rounds", 0, "rounds of TestEtcdProbe; 0: TestEtcdProbe is skipped")
	probeVariants = flag.String("probe-variants", "etcd_acquire_release,etcd_mutex_lock_unlock",
		"single-client etcd variants TestEtcdProbe alternates, comma-separated")
)

// probeCPUOps, when set, makes TestEtcdProbe also measure CPU time per
// operation, client and server: each round runs every variant for that many
// operations in a block of its own (the blocks in a new order each round),
// reading the CPU time of both processes' threads around the block
// (/proc/<pid>/task/<tid>/schedstat, in ns), and reports each variant's
// CPU per op and its difference from the last one named. CPU time is less
// disturbed by other jobs on the machine than wall time.
var probeCPUOps = flag.Int("probe-cpu-ops", 0, "operations per variant per round of TestEtcdProbe's CPU measurement; 0: none")

func TestEtcdProbe(t *testing.T) {
	if *probeRounds <= 0 {
		t.Skip("set -probe-rounds to run the probe")
	}
	ctx := t.Context()
	e, err := startEtcd(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.close(); err != nil {
			t.Error(err)
		}
	}()
	vs, err := e.etcdVariants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	extra, err := probeOwnVariants(t, e)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]variant{}
	for _, v := range append(vs, extra...) {
		byName[v.name] = v
	}
	names := strings.Split(*probeVariants, ",")
	if len(names) < 2 {
		t.Fatalf("-probe-variants %q: want at least two", *probeVariants)
	}
	ops := make([]func() error, len(names))
	for i, n := range names {
		v, ok := byName[n]
		if !ok || v.op == nil {
			t.Fatalf("-probe-variants: no single-client variant %s", n)
		}
		ops[i] = v.op
	}
	// Warm-up, not counted.
	if _, err := alternate(ctx, ops...); err != nil {
		t.Fatal(err)
	}
	base := len(names) - 1
	per := make([][]float64, len(names))
	for r := 1; r <= *probeRounds; r++ {
		ns, err := alternate(ctx, ops...)
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("round %2d:", r)
		for i := range names {
			per[i] = append(per[i], ns[i])
			line += fmt.Sprintf(" %s %.1f µs", names[i], ns[i]/1e3)
			if i < base {
				line += fmt.Sprintf(" (%.3f)", ns[i]/ns[base])
			}
		}
		t.Log(line)
	}
	if *probeCPUOps > 0 {
		probeCPU(t, e.srv.PID(), names, ops)
	}
	for i, n := range names {
		q := quartiles(per[i])
		alone := testing.Benchmark(byName[n].bench) // for its allocations
		t.Logf("%-32s µs/op median %.1f (quartiles %.1f-%.1f), %d allocs/op, %d B/op", n, q[2]/1e3, q[1]/1e3, q[3]/1e3,
			alone.AllocsPerOp(), alone.AllocedBytesPerOp())
	}
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			rs := make([]float64, len(per[i]))
			for r := range rs {
				rs[r] = per[i][r] / per[j][r]
			}
			q := quartiles(rs)
			t.Logf("RATIO %s/%s median %.3f quartiles %.3f-%.3f min %.3f max %.3f (%d rounds)",
				names[i], names[j], q[2], q[1], q[3], q[0], q[4], *probeRounds)
		}
	}
}

// probeOwnVariants are variants of the probe's own, beside the bench's:
//
//   - probe_limit_holder: etcd_acquire_release_limit whose release also
//     compares the key's value with the holder, as Release does;
//   - probe_limit_holder_gens: the same, whose release also deletes the
//     holder's generation keys: the two requests of etcd_acquire_release
//     while its store has not read its generation key, sent as raw Txns;
//   - probe_limit_holder_gens_line: the same, whose release also compares
//     the name's waiting line with empty (a compare over the line's range),
//     as Release does;
//   - probe_acquire_release_verified: etcd_acquire_release by a holder
//     whose store has verified names on its shared lease (taken by
//     AcquireAll, then renewed), so each Release rewrites the lease's
//     generation key instead of deleting the holder's generation keys.
func probeOwnVariants(t *testing.T, e *etcdEnv) ([]variant, error) {
	ctx := t.Context()
	leases, err := fenceetcd.NewLeaseStore(e.cli, fenceetcd.WithPrefix("/probe/leases"), fenceetcd.WithSharedLeases())
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, leases.Close)
	const holder, ttl = "holder-v", 60 * time.Second
	held, _, err := leases.AcquireAll(ctx, []string{"kept-0", "kept-1", "kept-2"}, holder, ttl)
	if err != nil {
		return nil, err
	}
	if _, lost, err := leases.RenewAll(ctx, held); err != nil || errors.Join(lost...) != nil {
		return nil, errors.Join(err, errors.Join(lost...))
	}
	// Raw requests between the limit and the fenced pair: the limit's
	// release with the holder's compare too, and with the delete of the
	// holder's generation keys too (the fenced Release's transaction when
	// the store has not seen its generation key), on a key as long as the
	// fenced one, with the Mutex session's etcd lease.
	session, err := concurrency.NewSession(e.cli, concurrency.WithTTL(60))
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, session.Close)
	const rawKey, rawHolder = "/probe/leases/lease/daily-report", "holder-a"
	raw := func(gens, line bool) func() error {
		return func() error {
			r, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(rawKey), "=", 0)).
				Then(clientv3.OpPut(rawKey, rawHolder, clientv3.WithLease(session.Lease()))).Commit()
			if err != nil || !r.Succeeded {
				return errors.Join(err, errors.New("raw acquire failed"))
			}
			ops := []clientv3.Op{clientv3.OpDelete(rawKey)}
			if gens {
				ops = append(ops, clientv3.OpDelete("/probe/leases/holdergen/holder-a/", clientv3.WithPrefix()))
			}
			cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rawKey), "=", r.Header.Revision),
				clientv3.Compare(clientv3.Value(rawKey), "=", rawHolder)}
			if line {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision("/probe/leases/queue/daily-report/"), "=", 0).WithPrefix())
			}
			d, err := e.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil || !d.Succeeded {
				return errors.Join(err, errors.New("raw release failed"))
			}
			return nil
		}
	}
	return []variant{
		{name: "probe_limit_holder", perOp: 1, op: raw(false, false)},
		{name: "probe_limit_holder_gens", perOp: 1, op: raw(true, false)},
		{name: "probe_limit_holder_gens_line", perOp: 1, op: raw(true, true)},
		{name: "probe_acquire_release_verified", perOp: 1, op: func() error {
			g, err := leases.Acquire(ctx, "daily-report", holder, ttl)
			if err != nil {
				return err
			}
			return leases.Release(ctx, g)
		}},
	}, nil
}

// probeCPU is TestEtcdProbe's CPU measurement (see probeCPUOps).
func probeCPU(t *testing.T, server int, names []string, ops []func() error) {
	client, cs, ss := os.Getpid(), make([][]float64, len(names)), make([][]float64, len(names))
	for r := range *probeRounds {
		for k := range names {
			i := (k + r) % len(names)
			c0, s0 := threadsCPU(t, client), threadsCPU(t, server)
			for range *probeCPUOps {
				if err := ops[i](); err != nil {
					t.Fatal(err)
				}
			}
			c1, s1 := threadsCPU(t, client), threadsCPU(t, server)
			cs[i] = append(cs[i], float64(c1-c0)/float64(*probeCPUOps))
			ss[i] = append(ss[i], float64(s1-s0)/float64(*probeCPUOps))
		}
	}
	for i, n := range names {
		qc, qs := quartiles(cs[i]), quartiles(ss[i])
		t.Logf("CPU %-32s client µs/op median %.1f (quartiles %.1f-%.1f), server %.1f (%.1f-%.1f)",
			n, qc[2]/1e3, qc[1]/1e3, qc[3]/1e3, qs[2]/1e3, qs[1]/1e3, qs[3]/1e3)
	}
	base := len(names) - 1
	for i := range base {
		dc, ds := make([]float64, len(cs[i])), make([]float64, len(ss[i]))
		for r := range dc {
			dc[r], ds[r] = cs[i][r]-cs[base][r], ss[i][r]-ss[base][r]
		}
		qc, qs := quartiles(dc), quartiles(ds)
		t.Logf("CPU %s - %s: client %+.1f µs/op (quartiles %+.1f to %+.1f), server %+.1f (%+.1f to %+.1f)",
			names[i], names[base], qc[2]/1e3, qc[1]/1e3, qc[3]/1e3, qs[2]/1e3, qs[1]/1e3, qs[3]/1e3)
	}
}

// threadsCPU is the CPU time, in ns, of all threads of process pid so far.
func threadsCPU(t *testing.T, pid int) int64 {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "schedstat"))
		if err != nil {
			continue // exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		total += n
	}
	return total
}
