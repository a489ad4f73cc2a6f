package torture

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// faultKind is what the nemesis does.
type faultKind string

const (
	// faultPause freezes a holder with SIGSTOP and thaws it with SIGCONT
	// after 0.5-3 TTL: its renewals stop with it, and whatever it does next
	// is done with the token it held.
	faultPause faultKind = "pause"
	// faultKill kills a holder with SIGKILL; a new holder process takes its
	// place at once. What it had in flight may still be applied.
	faultKill faultKind = "kill"
	// faultCrash crashes the server and restarts it on the same data:
	// PostgreSQL stopped immediately (no checkpoint), etcd killed with
	// SIGKILL.
	faultCrash faultKind = "crash"
	// faultDelay holds a holder's traffic in its proxy for 1-3 TTL, then
	// delivers it: requests sent while its lease was valid arrive late.
	faultDelay faultKind = "delay"
	// faultPartition cuts one member of an etcd cluster off from the
	// others for 1-3 TTL (etcdtemp.Cluster.Partition, through the members'
	// peer proxies), then heals it; its clients still reach it. Only a
	// cluster's nemesis draws it.
	faultPartition faultKind = "partition"
)

// allFaultKinds are the kinds every backend's nemesis draws from, in the
// order of the rotation. faultPartition is not among them: adding a kind
// here would change every schedule of an existing seed.
var allFaultKinds = []faultKind{faultPause, faultKill, faultCrash, faultDelay}

// plannedFault is one fault of a history's schedule.
type plannedFault struct {
	Kind faultKind
	At   time.Duration // after the history's start
	Dur  time.Duration // pause and delay: how long
	// AfterAck: at At, wait for the next acknowledged write (or advance)
	// and strike at once, at the holder that made it: a holder paused
	// then is in its work before the next write, which it sends with its
	// old token after the thaw; a crash then finds that write's commit
	// freshly acknowledged.
	AfterAck bool
	// Leader: aim at the holder that acquired last, if any, else at Slot.
	// A partition: cut off the member the cluster follows, else member
	// Slot (modulo the members).
	Leader bool
	Slot   int
	// InTx (a pause): at At, wait for the next holder to report being
	// inside a fenced transaction (PostgreSQL: between its two tables'
	// statements, the first table's rows written; etcd: its Txn sent) and
	// strike it there, at once. It takes precedence over AfterAck and
	// Leader; if no holder reports within 2 TTL, the pause strikes the
	// holder Leader or Slot names.
	InTx bool
}

func (f plannedFault) String() string {
	target := fmt.Sprintf("holder %d", f.Slot)
	switch {
	case f.InTx && f.Kind == faultPause:
		target = "the next holder inside a fenced transaction"
	case f.AfterAck:
		target = "the next acknowledged writer"
	case f.Leader:
		target = "the leader"
	}
	switch f.Kind {
	case faultCrash:
		if f.AfterAck {
			return fmt.Sprintf("crash at +%v, right after the next acknowledged write", f.At.Round(time.Millisecond))
		}
		return fmt.Sprintf("crash at +%v", f.At.Round(time.Millisecond))
	case faultKill:
		return fmt.Sprintf("kill %s at +%v", target, f.At.Round(time.Millisecond))
	case faultPartition:
		member := fmt.Sprintf("member %d", f.Slot)
		if f.Leader {
			member = "the leader"
		}
		when := fmt.Sprintf("at +%v", f.At.Round(time.Millisecond))
		if f.AfterAck {
			when += ", right after the next acknowledged write"
		}
		return fmt.Sprintf("partition %s of the cluster %s for %v", member, when, f.Dur.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s %s at +%v for %v", f.Kind, target, f.At.Round(time.Millisecond), f.Dur.Round(time.Millisecond))
}

// nemesisConfig shapes the schedules of a run.
type nemesisConfig struct {
	// kinds are rotated over the histories: history i's first fault is
	// kinds[i % len(kinds)], so every kind appears within a few histories
	// and a short run still has them all.
	kinds []faultKind
	// extra is the probability of each of up to two more faults, of any
	// kind in extraKinds (nil: kinds).
	extra      float64
	extraKinds []faultKind
	// pause and delay durations, in TTLs.
	pauseMin, pauseMax float64
	delayMin, delayMax float64
	// partition durations, in TTLs.
	partitionMin, partitionMax float64
	// leaderBias is the probability that a holder fault is aimed at the
	// leader: freezing a follower tests little.
	leaderBias float64
	// afterAck is the probability that a fault waits for the next
	// acknowledged write (see plannedFault.AfterAck).
	afterAck float64
	// inTx is the share of the pauses that strike inside a fenced
	// transaction (see plannedFault.InTx): the probability of each extra
	// pause, and one round of the rotation in 1/inTx for its own.
	inTx float64
	// pauseUntilTakeover keeps a paused holder frozen after its planned
	// duration until another holder's write was acknowledged.
	pauseUntilTakeover bool
	// ackedPauseUntilTakeover does so for the pauses that struck right
	// after an acknowledged write (plannedFault.AfterAck) only: the stale
	// holder of the lease-fencing article (SOURCES.md), frozen in its work
	// with a write decided, thawed once a new holder has written, so that
	// its next write is certainly stale. The plain pauses' late writes are
	// mostly invoked before the new holder's write was acknowledged, where
	// no real-time checker may call them stale (40 pg histories, one run
	// each: 14 stale writes rejected with it, 6 without). It changes no
	// schedule (planHistory does not read it).
	ackedPauseUntilTakeover bool
	// earliest and latest start of a fault, as fractions of the window.
	earliest, latest float64
}

func defaultNemesis() nemesisConfig {
	return nemesisConfig{kinds: allFaultKinds, extra: 0.3, pauseMin: 0.5, pauseMax: 3, delayMin: 1, delayMax: 3,
		partitionMin: 1, partitionMax: 3, leaderBias: 0.75, afterAck: 0.5, inTx: 0.25, earliest: 0.15, latest: 0.6}
}

// clusterNemesis is the nemesis of an etcd cluster: every kind of the
// others (a crash there kills the leader) and partitions. The rotation
// starts with the two that change the leader, so that the short run's
// three histories have a leader kill, a partition and a pause.
func clusterNemesis() nemesisConfig {
	nc := defaultNemesis()
	nc.kinds = []faultKind{faultCrash, faultPartition, faultPause, faultDelay, faultKill}
	return nc
}

// patroniNemesis is the nemesis of PostgreSQL under Patroni: every kind of
// the others, a crash being one of Patroni's failovers (patroniServer).
// The rotation starts with it, so that the short run has one; the extra
// faults are the holders' only, since each failover takes the history
// 15-30 s.
func patroniNemesis() nemesisConfig {
	nc := defaultNemesis()
	nc.kinds = []faultKind{faultCrash, faultPause, faultDelay, faultKill}
	nc.extraKinds = []faultKind{faultPause, faultDelay, faultKill}
	return nc
}

// planHistory is history idx's schedule: a function of the run's seed, the
// index and the configuration only, so -torture.seed (with
// -torture.only=idx) replays it.
func planHistory(seed uint64, idx int, nc nemesisConfig, ttl, window time.Duration, slots int) []plannedFault {
	rng := rand.New(rand.NewPCG(seed, uint64(idx)+1))
	frac := func(lo, hi float64) float64 { return lo + rng.Float64()*(hi-lo) }
	plan := func(kind faultKind) plannedFault {
		f := plannedFault{Kind: kind, At: time.Duration(frac(nc.earliest, nc.latest) * float64(window)),
			Leader: rng.Float64() < nc.leaderBias, Slot: rng.IntN(slots), AfterAck: rng.Float64() < nc.afterAck}
		switch kind {
		case faultPause:
			f.Dur = time.Duration(frac(nc.pauseMin, nc.pauseMax) * float64(ttl))
		case faultDelay:
			f.Dur = time.Duration(frac(nc.delayMin, nc.delayMax) * float64(ttl))
		case faultPartition:
			// Drawn only for partitions, so the schedules of a nemesis
			// without them draw exactly what they drew before.
			f.Dur = time.Duration(frac(nc.partitionMin, nc.partitionMax) * float64(ttl))
		}
		return f
	}
	faults := []plannedFault{plan(nc.kinds[idx%len(nc.kinds)])}
	extraKinds := nc.kinds
	if nc.extraKinds != nil {
		extraKinds = nc.extraKinds
	}
	for range 2 {
		if rng.Float64() < nc.extra {
			faults = append(faults, plan(extraKinds[rng.IntN(len(extraKinds))]))
		}
	}
	// Which pauses strike inside a transaction comes from a generator of
	// its own, one draw per pause: every other field of a schedule is what
	// the same seed drew before in-transaction pauses existed. The
	// rotation's own pause sets its draw aside: one round of the rotation
	// in 1/inTx has it (the first round included, so a short run has one).
	txRng := rand.New(rand.NewPCG(seed^inTxStream, uint64(idx)+1))
	for i := range faults {
		if faults[i].Kind != faultPause {
			continue
		}
		faults[i].InTx = txRng.Float64() < nc.inTx
		if i == 0 {
			faults[i].InTx = nc.inTx > 0 && (idx/len(nc.kinds))%int(math.Round(1/nc.inTx)) == 0
		}
	}
	return faults
}

// inTxStream sets the in-transaction draws apart from the schedule's.
const inTxStream = 0x696e2d7478 // "in-tx"

// inTxPauses counts where the pauses struck: aimed inside a fenced
// transaction (plannedFault.InTx), those of them that struck on a
// holder's report while it was inside one, and the others that struck
// inside one by chance (an aimed one included, when no holder reported
// within 2 TTL and it struck the leader).
type inTxPauses struct {
	aimed, struck, byChance int
	// late struck on a report, but after the transaction's own statements
	// were done; unreported fell back, no holder having reported within
	// 2 TTL.
	late, unreported int
	// reaction is how long after the holder reported being inside its
	// transaction the aimed pauses that struck there did: the nemesis's
	// reaction, which the in-transaction work must outlast.
	reaction []time.Duration
	// outcomes are the outcomes of the writes they froze.
	outcomes map[Outcome]int
}

// add counts the pauses of one history by where they struck.
func (p *inTxPauses) add(ops []*Op, frs []faultRecord) {
	for _, f := range frs {
		if f.Kind != faultPause {
			continue
		}
		var in *Op
		for _, op := range ops {
			if op.Kind == KindWrite && op.Holder == f.Target && op.inTxAt(f.Start) {
				in = op
				break
			}
		}
		if f.InTx {
			p.aimed++
			switch {
			case !f.OnReport:
				p.unreported++
			case in == nil:
				p.late++
			}
		}
		switch {
		case in != nil && f.OnReport:
			p.struck++
			p.reaction = append(p.reaction, time.Duration(f.Start-in.TxBegin))
			if p.outcomes == nil {
				p.outcomes = map[Outcome]int{}
			}
			p.outcomes[in.Outcome]++
		case in != nil:
			p.byChance++
		}
	}
}

// figure is the report's line on the pauses inside a fenced transaction.
func (p inTxPauses) figure() string {
	rs := slices.Clone(p.reaction)
	var outs []string
	for _, o := range []Outcome{OutAccepted, OutRejected, OutUnknown} {
		if n := p.outcomes[o]; n > 0 {
			outs = append(outs, fmt.Sprintf("%s %d", o, n))
		}
	}
	frozen := ""
	if len(outs) > 0 {
		frozen = "; the writes frozen: " + strings.Join(outs, ", ")
	}
	return fmt.Sprintf("   pauses inside a fenced transaction: aimed %d, struck inside %d (SIGSTOP after the holder's report: p50 %v, max %v%s), "+
		"too late %d, no holder inside within 2 TTL %d; inside by chance %d",
		p.aimed, p.struck, percentile(rs, 0.5).Round(10*time.Microsecond), percentile(rs, 1).Round(10*time.Microsecond), frozen,
		p.late, p.unreported, p.byChance)
}
