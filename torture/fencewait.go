package torture

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// serverGrace is how long after a server fault ended an operation may
// still be slow because of it: the holders' clients reconnect (etcd's
// backoff reaches 500 ms) and a restarted or healed member catches up.
const serverGrace = time.Second

// The promise checkFenceWaits checks: a newer holder's Advance or fenced
// write never waits on the fence for an older holder's open transaction.
// The fence decides at commit (the comparison and COMMIT in one round trip
// on PostgreSQL, one Txn on etcd), so a holder frozen inside its
// transaction holds no lock of the fence; only its own rows of the user
// tables stay locked, until it wakes or the idle-in-transaction timeout
// ends its session.
//
// Measured from the history: an operation B of token t that returned,
// while a fence operation O of another holder with a token below t was
// open (invoked and not yet returned; a killed holder's until its kill),
// must have taken at most the bound, unless something other than the
// fence explains the wait:
//
//   - a pause or a delay fault on B's own holder overlapped B;
//   - a server fault (crash, leader kill, partition) overlapped B or ended
//     less than serverGrace before B was invoked;
//   - the server or the machine stalled for everyone: a witness — a read
//     of the parent (straight to the server, through no proxy) or a lease
//     operation of any holder not paused or delayed meanwhile, none of
//     which waits on any lock of the fence — overlapped B and took more
//     than half the bound (an fsync stall of etcd's, CPU starvation);
//   - on PostgreSQL (rowLocks), B is a write and another holder's write of
//     a common part was open during B: B may wait for that write's row
//     locks in the user tables (torture.run, torture.line), which the idle
//     timeout bounds. An etcd Txn locks nothing.
//
// An Advance touches the floor only, never the user tables, so nothing
// but the fence, a fault or the machine can hold it up: a design whose
// check locks the floor row for the whole transaction (flavorCheckFirst)
// makes the Advance of the holder that took over from a frozen one wait
// until that one wakes or its session is ended.

// waitStats is what checkFenceWaits measured in one history.
type waitStats struct {
	// checked counts the advances ([0]) and writes ([1]) of a newer token
	// that ran while an older holder's fence operation was open; took
	// holds the durations of those of them that nothing else explains.
	checked [2]int
	took    [2][]time.Duration
	// explained counts, by reason, those slower than the bound that a
	// fault on their own holder, a server fault, a stall or row locks
	// explain.
	explained map[string]int
	// advances are the durations of every advance that returned and that
	// no fault or stall explains, older holder or not: the latency the
	// bound is set against.
	advances []time.Duration
}

// The reasons that explain a slow operation.
const (
	whyOwnFault  = "fault on its own holder"
	whyServer    = "server fault"
	whyStall     = "server or machine stall"
	whyRowLocks  = "another write's row locks"
	waitAdvances = 0
	waitWrites   = 1
)

func (w *waitStats) add(o waitStats) {
	for i := range 2 {
		w.checked[i] += o.checked[i]
		w.took[i] = append(w.took[i], o.took[i]...)
	}
	for k, n := range o.explained {
		if w.explained == nil {
			w.explained = map[string]int{}
		}
		w.explained[k] += n
	}
	w.advances = append(w.advances, o.advances...)
}

// checkFenceWaits reports every advance or write of a newer token that
// waited longer than bound while an older holder's fence operation was
// open, with no explanation but the fence (see above). rowLocks: the
// user tables lock what a write wrote until its transaction ends.
func checkFenceWaits(ops []*Op, faults []faultRecord, bound time.Duration, rowLocks bool) ([]violation, waitStats) {
	st := waitStats{explained: map[string]int{}}
	// openUntil is when a fence operation stopped being open: its return,
	// or its holder's kill (the server then sees its connection close),
	// else never.
	openUntil := func(o *Op) int64 {
		if o.Return != 0 {
			return o.Return
		}
		for _, f := range faults {
			if f.Kind == faultKill && f.Target == o.Holder && f.Start >= o.Invoke {
				return f.End
			}
		}
		return math.MaxInt64
	}
	overlaps := func(o, b *Op) bool { return o.Invoke < b.Return && openUntil(o) > b.Invoke }
	ownFault := func(b *Op) bool {
		for _, f := range faults {
			if (f.Kind == faultPause || f.Kind == faultDelay) && f.Target == b.Holder && f.Start < b.Return && f.End > b.Invoke {
				return true
			}
		}
		return false
	}
	var slowWitnesses []*Op
	for _, w := range ops {
		witness := (w.Kind == KindRead && w.Outcome == OutOK) || w.Kind == KindAcquire || w.Kind == KindRenew || w.Kind == KindRelease
		if witness && w.Return != 0 && w.Return-w.Invoke > int64(bound/2) && (w.Kind == KindRead || !ownFault(w)) {
			slowWitnesses = append(slowWitnesses, w)
		}
	}
	faultWhy := func(b *Op) string {
		if ownFault(b) {
			return whyOwnFault
		}
		for _, f := range faults {
			if f.serverFault() && f.Start < b.Return && f.End+int64(serverGrace) > b.Invoke {
				return whyServer
			}
		}
		for _, w := range slowWitnesses {
			if w.Invoke < b.Return && w.Return > b.Invoke {
				return whyStall
			}
		}
		return ""
	}
	var vs []violation
	for _, b := range ops {
		if !b.fenceOp() || b.Return == 0 {
			continue
		}
		d := time.Duration(b.Return - b.Invoke)
		why := faultWhy(b)
		if b.Kind == KindAdvance && why == "" {
			st.advances = append(st.advances, d)
		}
		var older *Op // the newest of them, for the report
		for _, o := range ops {
			if o.fenceOp() && o.Holder != b.Holder && o.Token < b.Token && overlaps(o, b) && (older == nil || o.Token >= older.Token) {
				older = o
			}
		}
		if older == nil {
			continue
		}
		k := waitAdvances
		if b.Kind == KindWrite {
			k = waitWrites
			if why == "" && rowLocks {
				for _, o := range ops {
					if o.Kind == KindWrite && o.Holder != b.Holder && o.Mask&b.Mask != 0 && overlaps(o, b) {
						why = whyRowLocks
						break
					}
				}
			}
		}
		st.checked[k]++
		switch {
		case why == "":
			st.took[k] = append(st.took[k], d)
			if d > bound {
				vs = append(vs, violation{chkFenceWait, fmt.Sprintf("%s took %v, more than the bound %v, while %s of an older holder was open; "+
					"no fault on its holder, no server fault, no read or lease operation as slow%s explains the wait",
					b, d.Round(time.Millisecond), bound, older, rowLockNote(b, rowLocks))})
			}
		case d > bound:
			st.explained[why]++
		}
	}
	return vs, st
}

func rowLockNote(b *Op, rowLocks bool) string {
	if b.Kind == KindWrite && rowLocks {
		return ", no other holder's open write of a common part"
	}
	return ""
}

// percentile is the q-quantile (0..1] of ds by nearest rank, sorting ds;
// 0 for none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[max(0, int(math.Ceil(q*float64(len(ds))))-1)]
}

// figures are the checker's lines of the report: what the design promises
// against what the run saw.
func (w waitStats) figures(bound time.Duration) []string {
	ms := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	dist := func(ds []time.Duration) string {
		ds = slices.Clone(ds)
		if len(ds) == 0 {
			return "none"
		}
		return fmt.Sprintf("shortest %s, median %s, longest %s", ms(slices.Min(ds)), ms(percentile(ds, 0.5)), ms(percentile(ds, 1)))
	}
	var explained []string
	for _, why := range []string{whyOwnFault, whyServer, whyStall, whyRowLocks} {
		if n := w.explained[why]; n > 0 {
			explained = append(explained, fmt.Sprintf("%s %d", why, n))
		}
	}
	exp := "none"
	if len(explained) > 0 {
		exp = strings.Join(explained, ", ")
	}
	ds := slices.Clone(w.advances)
	return []string{
		fmt.Sprintf("   waited on the fence: expected at most %v for an advance or write of a newer token while an older holder's was open; "+
			"observed: advances %d (%s), writes %d (%s); slower but explained otherwise: %s",
			bound, w.checked[waitAdvances], dist(w.took[waitAdvances]), w.checked[waitWrites], dist(w.took[waitWrites]), exp),
		fmt.Sprintf("   advance latency, every advance no fault or stall explains: %d, p50 %s, p99 %s, max %s",
			len(ds), ms(percentile(ds, 0.5)), ms(percentile(ds, 0.99)), ms(percentile(ds, 1))),
	}
}
