package torture

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// SuiteOptions configure a torture run of one backend: the fence's
// histories, then its negative controls.
type SuiteOptions struct {
	Histories        int    // histories of the fence (make torture: 200)
	ControlHistories int    // histories of each negative control
	Lanes            int    // histories run side by side
	Seed             uint64 // the run's seed: every schedule derives from it
	Only             int    // >= 0: only this history of each run (a replay); -1: all
	// EvidenceDir receives every history of the fence with a violation;
	// ControlEvidenceDir one violating history per negative control.
	EvidenceDir, ControlEvidenceDir string
	Replay                          string // the flags that replay the run, for the evidence
	HolderArgs                      []string
	Logf                            func(format string, args ...any)
}

// timing is what differs between the backends: etcd's leases are whole
// seconds (and its lessor revokes expired ones every 500 ms), PostgreSQL's
// may be as short as those of the lease-fencing article (SOURCES.md).
type timing struct {
	ttl, window, settle, readEvery time.Duration
}

var timings = map[string]timing{
	"pg":   {ttl: 500 * time.Millisecond, window: 1600 * time.Millisecond, settle: 400 * time.Millisecond, readEvery: 100 * time.Millisecond},
	"etcd": {ttl: time.Second, window: 2500 * time.Millisecond, settle: 600 * time.Millisecond, readEvery: 150 * time.Millisecond},
	// The cluster keeps etcd's shortest lease, 1s (etcd's minimum TTL is
	// 1.5 election timeouts rounded up to whole seconds: 1s with etcdtemp's
	// 500ms): a leader change, which pauses writes and renewals for an
	// election timeout or two, then ends some holding periods and not
	// others, and both are checked. A leader kill holds the fault for the
	// election and the restart (about 1s), so the window is half a second
	// longer than a single member's, and the settle 200ms longer: after a
	// restart or a heal the holders' clients reconnect to that member
	// (their backoff reaches 500ms) before the history stops.
	"etcd-cluster": {ttl: time.Second, window: 3000 * time.Millisecond, settle: 800 * time.Millisecond, readEvery: 150 * time.Millisecond},
	// Under Patroni every commit also waits for the synchronous standby's
	// flush, and after a failover each holder's pools find the new leader
	// by trying the members in turn: a lease of 1 s, and a settle long
	// enough for that search.
	"pg-patroni": {ttl: time.Second, window: 2500 * time.Millisecond, settle: time.Second, readEvery: 150 * time.Millisecond},
}

// txWork is the holders' work inside each write's transaction, between
// its two tables' statements: the nemesis's in-transaction pauses strike
// in it, so it must outlast the nemesis's reaction to the holder's report
// (the figures show that reaction).
const txWork = 5 * time.Millisecond

// fenceWaitBound is how long an advance or write of a newer token may take
// while an older holder's is open, when nothing but the fence can explain
// the wait (checkFenceWaits). Measured (docs/torture.md): every advance of
// the fence that nothing else explains took at most 264 ms, with two CPU
// burners beside the run; the check-first control makes the new leader's
// advance wait for the rest of a frozen holder's idle timeout after the
// lease passed: checkFirstIdle - 1 TTL, 1.5 s on PostgreSQL. The bound
// sits between, about three times the one and half the other.
const fenceWaitBound = 750 * time.Millisecond

// checkFirstIdle is the check-first control's idle-in-transaction
// timeout, in TTLs, and its pauses inside a transaction last as long or
// longer: long enough that the control's wait is well above
// fenceWaitBound on a loaded machine.
const checkFirstIdle = 4

// nemesisFor is the nemesis of a backend's fence (the controls build their
// own): every backend draws from allFaultKinds, the cluster also
// partitions (clusterNemesis); a pause right after an acknowledged write
// holds its holder until another holder's write was acknowledged.
func nemesisFor(backend string) nemesisConfig {
	nc := defaultNemesis()
	switch backend {
	case "etcd-cluster":
		nc = clusterNemesis()
	case "pg-patroni":
		nc = patroniNemesis()
	}
	nc.ackedPauseUntilTakeover = true
	return nc
}

// SuiteReport is the outcome of RunSuite: the figures as lines, the runs,
// and what failed.
type SuiteReport struct {
	Lines    []string
	Runs     []*runResult
	Problems []error
	// ControlEvidence lists, per negative control, the directory of its
	// saved history (with the visualization).
	ControlEvidence map[string]string
}

// control is a negative control: a design that must fail, with the
// checkers of which at least one must catch it.
type control struct {
	name    string
	slug    string // its evidence directory
	flavor  flavor
	expect  []string
	nemesis nemesisConfig
	quota   [2]int
	noFloor bool
	srv     func() (server, error) // the control's server (default: the fence's)
}

func (o SuiteOptions) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// RunSuite runs the torture of backend ("pg", "etcd", "etcd-cluster", a
// 3-member etcd cluster, or "pg-patroni", three PostgreSQL members under
// Patroni): the fence, then the negative controls, and
// reports the figures. Problems are violations
// of the fence, controls that did not fire, and harness failures.
func RunSuite(ctx context.Context, backend string, opt SuiteOptions) *SuiteReport {
	rep := &SuiteReport{ControlEvidence: map[string]string{}}
	fail := func(err error) *SuiteReport { rep.Problems = append(rep.Problems, err); return rep }
	tm, ok := timings[backend]
	if !ok {
		return fail(fmt.Errorf("unknown backend %q", backend))
	}
	var srv server
	var err error
	t0 := time.Now()
	switch backend {
	case "pg":
		srv, err = startPG(ctx, false)
	case "etcd":
		srv, err = startEtcd(ctx)
	case "etcd-cluster":
		srv, err = startEtcdCluster(ctx)
	case "pg-patroni":
		srv, err = startPatroni(ctx, false)
	}
	if err != nil {
		return fail(err)
	}
	defer srv.close()
	opt.logf("%s: server up in %v", srv.name(), time.Since(t0).Round(time.Millisecond))
	if d, ok := srv.(interface{ describe() string }); ok {
		opt.logf("%s: %s", srv.name(), d.describe())
	}

	base := func(name string, fl flavor, histories int) runConfig {
		return runConfig{name: name, flavor: fl, ttl: tm.ttl, window: tm.window, settle: tm.settle,
			readEvery: tm.readEvery, histories: histories, only: opt.Only, lanes: max(1, opt.Lanes), holders: 3,
			seed: opt.Seed, nemesis: nemesisFor(backend), quotaMin: 3, quotaMax: 15,
			workMin: 10 * time.Millisecond, workMax: 50 * time.Millisecond, txWork: txWork, fenceWait: fenceWaitBound,
			linTimeout: 2 * time.Minute, replay: opt.Replay, logf: opt.Logf, holderArgs: opt.HolderArgs}
	}

	// The fence.
	cfg := base(backend, flavorFenced, opt.Histories)
	cfg.evidenceDir = opt.EvidenceDir
	res, err := runTorture(ctx, srv, cfg)
	rep.add(res, err)
	if res != nil && opt.Only < 0 && res.histories >= len(allFaultKinds)-1 {
		// The schedules rotate the kinds, so three histories already have
		// three kinds: fewer means the nemesis did not do its job.
		faults, kinds := 0, 0
		for _, n := range res.faults {
			faults += n
			kinds += min(n, 1)
		}
		if faults < 3 || kinds < 3 {
			rep.Problems = append(rep.Problems, fmt.Errorf("%s: the nemesis injected %d faults of %d kinds; the run needs at least 3 of 3", res.name, faults, kinds))
		}
		// And a run as long as the rotation has had every kind of it: on
		// the cluster, leader kills and partitions are the point.
		if res.histories >= len(cfg.nemesis.kinds) {
			for _, k := range cfg.nemesis.kinds {
				if res.faults[k] == 0 {
					rep.Problems = append(rep.Problems, fmt.Errorf("%s: %d histories and no %s fault", res.name, res.histories, k))
				}
			}
		}
	}

	// The negative controls, under the same nemesis.
	pause := defaultNemesis()
	// Three pauses a history, one after the other (the next one strikes the
	// next acknowledged writer): one may find its holder past its lease
	// already, when the machine stalls, and send nothing after the thaw.
	pause.kinds, pause.extra, pause.pauseMin, pause.pauseMax = []faultKind{faultPause}, 1, 2, 3
	pause.leaderBias, pause.afterAck, pause.earliest, pause.latest = 1, 1, 0.2, 0.35
	pause.pauseUntilTakeover = true
	pause.inTx = 0
	controls := []control{{
		name: backend + " unfenced resource", slug: backend + "-unfenced", flavor: flavorUnfenced, expect: []string{chkI3},
		// The leader never resigns (a resignation right before the pause
		// would take its next write away) and is frozen right after an
		// acknowledged write, in the work before its next one, until a new
		// leader's write was acknowledged: after the thaw it sends that
		// next write with its old token.
		nemesis: pause, quota: [2]int{1000, 1000}, noFloor: true,
	}}
	var nonDurable *pgServer
	if backend == "pg" {
		crashes := defaultNemesis()
		crashes.kinds, crashes.extra, crashes.afterAck, crashes.earliest, crashes.latest = []faultKind{faultCrash}, 0.5, 1, 0.4, 0.8
		// Pauses and delays only: the bug shows on a holding period's
		// first write after its Advance, which a crash or a kill can take
		// away from a whole short history.
		quiet := defaultNemesis()
		quiet.kinds, quiet.inTx = []faultKind{faultPause, faultDelay}, 0
		// Three pauses a history, each inside the next holder's fenced
		// transaction, for 2-3 TTL: the lease passes to another holder
		// while the frozen one holds its lock, and that holder's Advance
		// waits for it.
		inTx := defaultNemesis()
		inTx.kinds, inTx.extra, inTx.pauseMin, inTx.pauseMax, inTx.inTx = []faultKind{faultPause}, 1, checkFirstIdle, checkFirstIdle+1, 1
		inTx.earliest, inTx.latest = 0.2, 0.35
		controls = append(controls, control{
			name: "pg fence comparing < instead of <=", slug: "pg-strict-compare", flavor: flavorStrict, expect: []string{chkLin},
			nemesis: quiet, quota: [2]int{3, 15},
		}, control{
			name: "pg fence checking first, its floor row lock held until commit", slug: "pg-check-first", flavor: flavorCheckFirst,
			expect: []string{chkFenceWait}, nemesis: inTx, quota: [2]int{3, 15},
		}, control{
			name: "pg non-durable lease and fence (synchronous_commit=off, immediate stops)", slug: "pg-non-durable", flavor: flavorNaive,
			expect: []string{chkI2Reuse, chkLost},
			// Short holding periods: acquires and writes both land in the WAL
			// page the crash loses.
			nemesis: crashes, quota: [2]int{2, 4},
			srv: func() (server, error) {
				t := time.Now()
				s, err := startPG(ctx, true)
				if err != nil {
					return nil, err
				}
				nonDurable = s
				opt.logf("%s: server up in %v", s.name(), time.Since(t).Round(time.Millisecond))
				return s, nil
			},
		})
	}
	var unsafePatroni *patroniServer
	if backend == "pg-patroni" {
		// Patroni's failovers, the leader's host killed each time with its
		// replicas held back, on a cluster without synchronous_mode: the
		// library's own fence, which no configuration of the client can
		// save from a promoted replica that lacks its grants.
		crashes := defaultNemesis()
		crashes.kinds, crashes.extra, crashes.afterAck, crashes.earliest, crashes.latest = []faultKind{faultCrash}, 0, 1, 0.2, 0.4
		controls = append(controls, control{
			name: "pg under Patroni with synchronous_mode off, replicas held back before the leader's host is killed", slug: "pg-patroni-async",
			flavor: flavorFenced, expect: []string{chkI2Reuse, chkLost},
			// Short holding periods: acquires land in the held-back WAL.
			nemesis: crashes, quota: [2]int{2, 4},
			srv: func() (server, error) {
				t := time.Now()
				s, err := startPatroni(ctx, true)
				if err != nil {
					return nil, err
				}
				unsafePatroni = s
				opt.logf("%s: server up in %v; %s", s.name(), time.Since(t).Round(time.Millisecond), s.describe())
				return s, nil
			},
		})
	}
	defer func() {
		if nonDurable != nil {
			_ = nonDurable.close()
		}
		if unsafePatroni != nil {
			_ = unsafePatroni.close()
		}
	}()
	for _, c := range controls {
		csrv := srv
		if c.srv != nil {
			if csrv, err = c.srv(); err != nil {
				rep.Problems = append(rep.Problems, fmt.Errorf("%s: %w", c.name, err))
				continue
			}
		}
		cfg := base(c.name, c.flavor, opt.ControlHistories)
		cfg.nemesis, cfg.quotaMin, cfg.quotaMax, cfg.noFloor = c.nemesis, c.quota[0], c.quota[1], c.noFloor
		cfg.evidenceDir, cfg.keepOne, cfg.slug = opt.ControlEvidenceDir, true, c.slug
		res, err := runTorture(ctx, csrv, cfg)
		if err != nil {
			rep.Problems = append(rep.Problems, err)
			continue
		}
		rep.Runs = append(rep.Runs, res)
		fired := 0
		for _, chk := range c.expect {
			fired += res.violations[chk]
		}
		line := fmt.Sprintf("negative control exposes: %s: %s (in %d of %d histories)",
			c.name, describeViolations(res.violations, c.expect), res.violating, res.histories)
		if fired == 0 {
			line = fmt.Sprintf("negative control NOT exposed: %s: none of %s fired in %d histories (found: %s)",
				c.name, strings.Join(c.expect, ", "), res.histories, describeViolations(res.violations, nil))
			rep.Problems = append(rep.Problems, errors.New(line))
		}
		rep.Lines = append(rep.Lines, res.figures()...)
		rep.Lines = append(rep.Lines, line)
		if len(res.evidence) > 0 {
			rep.ControlEvidence[c.name] = res.evidence[0]
			rep.Lines = append(rep.Lines, "  saved: "+res.evidence[0])
		}
	}

	// The library on the non-durable cluster, under the same immediate
	// stops: fencepg forces a durable commit for every statement that
	// issues a token or raises a floor, and for the transaction a check
	// ran in, so the server's synchronous_commit=off must not matter.
	if nonDurable != nil && !errors.Is(ctx.Err(), context.Canceled) {
		cfg := base("pg fence on synchronous_commit=off", flavorFenced, opt.ControlHistories)
		cfg.slug = "pg-sync-off"
		last := controls[len(controls)-1]
		cfg.nemesis, cfg.quotaMin, cfg.quotaMax = last.nemesis, last.quota[0], last.quota[1]
		cfg.evidenceDir = opt.EvidenceDir
		res, err := runTorture(ctx, nonDurable, cfg)
		rep.add(res, err)
	}
	return rep
}

// add reports a run of the fence: its figures, and every violation as a
// problem.
func (rep *SuiteReport) add(res *runResult, err error) {
	if err != nil {
		rep.Problems = append(rep.Problems, err)
	}
	if res == nil {
		return
	}
	rep.Runs = append(rep.Runs, res)
	rep.Lines = append(rep.Lines, res.figures()...)
	if len(res.violations) > 0 {
		rep.Problems = append(rep.Problems, fmt.Errorf("%s: %s in %d histories, e.g. %s; evidence: %s",
			res.name, describeViolations(res.violations, nil), res.violating, strings.Join(res.examples, "; "),
			strings.Join(res.evidence, ", ")))
	}
	for _, h := range res.harness {
		rep.Problems = append(rep.Problems, fmt.Errorf("%s: %s", res.name, h))
	}
}

// describeViolations lists violation counts, those of first (in order)
// first.
func describeViolations(vs map[string]int, first []string) string {
	if len(vs) == 0 {
		return "no violations"
	}
	var parts []string
	for _, c := range first {
		if n := vs[c]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s x%d", c, n))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(vs)) {
		if !slices.Contains(first, c) {
			parts = append(parts, fmt.Sprintf("%s x%d", c, vs[c]))
		}
	}
	return strings.Join(parts, ", ")
}

// figures are the run's lines of the report.
func (res *runResult) figures() []string {
	total := 0
	for _, m := range res.ops {
		for _, n := range m {
			total += n
		}
	}
	count := func(k Kind) string {
		m := res.ops[k]
		n := 0
		for _, v := range m {
			n += v
		}
		var parts []string
		for _, o := range []Outcome{OutOK, OutAccepted, OutRejected, OutHeld, OutLost, OutUnknown} {
			if m[o] > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", o, m[o]))
			}
		}
		return fmt.Sprintf("%s %d (%s)", k, n, strings.Join(parts, ", "))
	}
	faults := 0
	var fk []string
	// The four kinds of every backend, then any other the run drew from
	// (the cluster's partitions).
	kinds := slices.Clone(allFaultKinds)
	for _, k := range res.kinds {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	for _, k := range kinds {
		faults += res.faults[k]
		fk = append(fk, fmt.Sprintf("%s %d", k, res.faults[k]))
	}
	var verdicts []string
	for _, v := range slices.Sorted(maps.Keys(res.verdicts)) {
		verdicts = append(verdicts, fmt.Sprintf("%s %d", v, res.verdicts[v]))
	}
	down := res.downLabel
	if down == "" {
		down = "server down"
	}
	lines := []string{
		fmt.Sprintf("== %s on %s: %d histories in %v, seed %d", res.name, res.server, res.histories,
			res.wall.Round(time.Second), res.seed),
		fmt.Sprintf("   operations %d: %s; %s; %s", total, count(KindWrite), count(KindAdvance), count(KindRead)),
		fmt.Sprintf("   lease operations: %s; %s; %s", count(KindAcquire), count(KindRenew), count(KindRelease)),
		fmt.Sprintf("   faults %d: %s (%s %v in all)", faults, strings.Join(fk, ", "), down, res.downtime.Round(time.Millisecond)),
	}
	if res.terms[0] > 0 && res.terms[1] > 0 {
		// Every election raises the term by one (a split vote by one more),
		// a partitioned follower's failed pre-votes do not: roughly the
		// leader changes the tokens were checked across, faults and the
		// load's own.
		lines = append(lines, fmt.Sprintf("   leader elections: %d over the run (raft term %d -> %d)",
			res.terms[1]-res.terms[0], res.terms[0], res.terms[1]))
	}
	lines = append(lines, res.inTx.figure())
	lines = append(lines, res.waits.figures(res.fenceWait)...)
	return append(lines,
		fmt.Sprintf("   checker time %v; linearizability verdicts: %s", res.checkerTime.Round(time.Millisecond), strings.Join(verdicts, ", ")),
		fmt.Sprintf("   violations %d in %d histories: %s", sumValues(res.violations), res.violating, describeViolations(res.violations, nil)),
	)
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
