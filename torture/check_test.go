package torture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Each checker, on histories written by hand: a correct one passes them
// all, and each broken rule is caught by the checker named for it. The
// negative controls of TestTorture show the same on real servers.

// hist builds a history; times are in milliseconds.
type hist struct {
	ops    []*Op
	faults []faultRecord
}

func (h *hist) add(op Op) *Op {
	op.ID = len(h.ops)
	op.Invoke *= int64(time.Millisecond)
	op.Return *= int64(time.Millisecond)
	h.ops = append(h.ops, &op)
	return &op
}

func (h *hist) acquire(client int, holder string, token uint64, inv, ret int64) {
	h.add(Op{Client: client, Holder: holder, Kind: KindAcquire, Token: token, Outcome: OutOK, Invoke: inv, Return: ret})
}

func (h *hist) advance(client int, token uint64, out Outcome, floor uint64, inv, ret int64) {
	h.add(Op{Client: client, Holder: holderName(client), Kind: KindAdvance, Token: token, Outcome: out, Floor: floor, Invoke: inv, Return: ret})
}

func (h *hist) write(client int, token uint64, mask uint8, content string, out Outcome, floor uint64, inv, ret int64) {
	h.add(Op{Client: client, Holder: holderName(client), Kind: KindWrite, Token: token, Mask: mask, Content: content,
		Outcome: out, Floor: floor, Invoke: inv, Return: ret})
}

// fault adds a fault on client's holder ("" target: the server's).
func (h *hist) fault(kind faultKind, client int, start, end int64) {
	target := ""
	if client > 0 {
		target = holderName(client)
	}
	h.faults = append(h.faults, faultRecord{Kind: kind, Target: target,
		Start: start * int64(time.Millisecond), End: end * int64(time.Millisecond)})
}

func holderName(client int) string { return fmt.Sprintf("h%d", client) }

// read adds a read showing floor and, in both tables, cells.
func (h *hist) read(floor uint64, cells [NumParts]Cell, inv, ret int64) Snapshot {
	snap := Snapshot{Floor: floor, Tables: [2][NumParts]Cell{cells, cells}}
	h.add(Op{Client: 0, Holder: "reader", Kind: KindRead, Outcome: OutOK, Read: &snap, Invoke: inv, Return: ret})
	return snap
}

func check(t *testing.T, h *hist, final Snapshot, i2 *i2Run, noFloor bool) checkResult {
	t.Helper()
	if i2 == nil {
		i2 = newI2Run()
	}
	return checkHistory(h.ops, h.faults, final, i2, 0,
		checkOptions{noFloor: noFloor, linTimeout: 10 * time.Second, fenceWait: fenceWaitBound, rowLocks: true})
}

func checkers(res checkResult) []string {
	var cs []string
	for _, v := range res.violations {
		if !slices.Contains(cs, v.Checker) {
			cs = append(cs, v.Checker)
		}
	}
	slices.Sort(cs)
	return cs
}

func expectCheckers(t *testing.T, res checkResult, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := checkers(res); !slices.Equal(got, want) {
		t.Errorf("checkers fired: %v, want %v; violations:\n%v", got, want, res.violations)
	}
}

// A holder takes over from a stale one; the stale one's late write is
// rejected; an unknown write of the new one may or may not have landed.
func correctHistory() (*hist, Snapshot) {
	h := &hist{}
	h.acquire(1, "a", 1, 0, 1)
	h.advance(1, 1, OutAccepted, 1, 2, 3)
	h.write(1, 1, 0b0011, "a1", OutAccepted, 1, 4, 5)
	h.acquire(2, "b", 2, 10, 11)
	h.advance(2, 2, OutAccepted, 2, 12, 13)
	h.write(2, 2, 0b0110, "b1", OutAccepted, 2, 14, 15)
	h.write(1, 1, 0b1000, "a2", OutRejected, 2, 16, 17) // the stale holder
	h.read(2, [NumParts]Cell{{1, "a1"}, {2, "b1"}, {2, "b1"}, {}}, 18, 19)
	h.write(2, 2, 0b1000, "b2", OutUnknown, 0, 20, 0) // never returned
	final := h.read(2, [NumParts]Cell{{1, "a1"}, {2, "b1"}, {2, "b1"}, {2, "b2"}}, 30, 31)
	return h, final
}

func TestCheckersPassCorrectHistory(t *testing.T) {
	h, final := correctHistory()
	res := check(t, h, final, nil, false)
	expectCheckers(t, res)
	if res.lin != porcupine.Ok {
		t.Errorf("linearizability: %v, want Ok", res.lin)
	}
}

func TestUnknownWriteBranches(t *testing.T) {
	// The same history where the unknown write never landed is fine too.
	h, _ := correctHistory()
	h.ops = h.ops[:len(h.ops)-1]
	final := h.read(2, [NumParts]Cell{{1, "a1"}, {2, "b1"}, {2, "b1"}, {}}, 30, 31)
	expectCheckers(t, check(t, h, final, nil, false))
}

func TestI3CatchesStaleWriteAccepted(t *testing.T) {
	h := &hist{}
	h.write(1, 2, 0b0001, "b1", OutAccepted, 2, 0, 1)
	h.write(2, 1, 0b0001, "a1", OutAccepted, 1, 5, 6) // invoked after token 2 was acknowledged
	final := h.read(2, [NumParts]Cell{{1, "a1"}}, 10, 11)
	// Token 2's acknowledged write is gone too.
	expectCheckers(t, check(t, h, final, nil, false), chkI3, chkFinal, chkLost, chkLin)
}

func TestI3ConcurrentIsNoViolation(t *testing.T) {
	// Token 1's write was invoked before token 2's was acknowledged: I3 in
	// real time does not apply, and an order exists (1 before 2).
	h := &hist{}
	h.write(1, 2, 0b0001, "b1", OutAccepted, 2, 0, 10)
	h.write(2, 1, 0b0001, "a1", OutAccepted, 1, 5, 6)
	final := h.read(2, [NumParts]Cell{{2, "b1"}}, 20, 21)
	expectCheckers(t, check(t, h, final, nil, false))
}

func TestI2CatchesReuseAndOrderAcrossHistories(t *testing.T) {
	i2 := newI2Run()
	h := &hist{}
	h.acquire(1, "a", 5, 0, 1)
	expectCheckers(t, check(t, h, Snapshot{}, i2, false))
	h2 := &hist{}
	h2.acquire(1, "b", 5, 100, 101) // a crash took token 5 back
	h2.acquire(2, "c", 4, 110, 111) // and a smaller one after it
	res := checkHistory(h2.ops, nil, Snapshot{}, i2, 1, checkOptions{linTimeout: time.Second})
	expectCheckers(t, res, chkI2Reuse, chkI2Order)
}

func TestLostAcknowledgedWrite(t *testing.T) {
	h := &hist{}
	h.advance(1, 3, OutAccepted, 3, 0, 1)
	h.write(1, 3, 0b0001, "c1", OutAccepted, 3, 2, 3)
	h.read(0, [NumParts]Cell{}, 10, 11) // after a crash: nothing of it
	final := h.read(3, [NumParts]Cell{{3, "c1"}}, 20, 21)
	expectCheckers(t, check(t, h, final, nil, false), chkLost, chkLin)
}

func TestFinalStateCatchesRejectedWriteThatLanded(t *testing.T) {
	h := &hist{}
	h.advance(1, 2, OutAccepted, 2, 0, 1)
	h.write(2, 1, 0b0001, "a1", OutRejected, 2, 5, 6)
	final := h.read(2, [NumParts]Cell{{1, "a1"}}, 10, 11)
	expectCheckers(t, check(t, h, final, nil, false), chkFinal, chkLin)
}

func TestLinearizabilityCatchesStrictCompare(t *testing.T) {
	// A fence comparing < instead of <= refuses the holder's own second
	// write, reporting its own token as the floor: no other checker sees it.
	h := &hist{}
	h.advance(1, 1, OutAccepted, 1, 0, 1)
	h.write(1, 1, 0b0001, "a1", OutRejected, 1, 2, 3)
	final := h.read(1, [NumParts]Cell{}, 10, 11)
	expectCheckers(t, check(t, h, final, nil, false), chkLin)
}

func TestTablesDisagree(t *testing.T) {
	h := &hist{}
	h.write(1, 1, 0b0001, "a1", OutAccepted, 1, 0, 1)
	snap := Snapshot{Floor: 1}
	snap.Tables[0][0] = Cell{1, "a1"}
	h.add(Op{Kind: KindRead, Holder: "reader", Outcome: OutOK, Read: &snap, Invoke: 10, Return: 11})
	expectCheckers(t, check(t, h, snap, nil, false), chkAtomic, chkFinal, chkLost, chkLin)
}

func TestNoFloorIgnoresTheFloor(t *testing.T) {
	// The unfenced control has no floor: reads show 0, and only the tokens
	// of the accepted writes count.
	h := &hist{}
	h.write(1, 1, 0b0001, "a1", OutAccepted, 0, 0, 1)
	h.write(2, 2, 0b0001, "b1", OutAccepted, 0, 2, 3)
	final := h.read(0, [NumParts]Cell{{2, "b1"}}, 10, 11)
	expectCheckers(t, check(t, h, final, nil, true))
	// The same history is a violation of the fenced register.
	expectCheckers(t, check(t, h, final, nil, false), chkFinal, chkLost, chkLin)
}

func TestPlanIsAFunctionOfSeedAndIndex(t *testing.T) {
	nc := defaultNemesis()
	a := planHistory(42, 7, nc, time.Second, 2*time.Second, 3)
	b := planHistory(42, 7, nc, time.Second, 2*time.Second, 3)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed and index, different schedules:\n%v\n%v", a, b)
	}
	kinds := map[faultKind]bool{}
	for i := range 4 {
		kinds[planHistory(42, i, nc, time.Second, 2*time.Second, 3)[0].Kind] = true
	}
	if len(kinds) != len(allFaultKinds) {
		t.Errorf("four histories' first faults cover %v, want every kind", kinds)
	}
}

// Old seeds replay the same: the schedules a nemesis without partitions
// draws are those it drew before partitions existed. The fingerprint was
// taken with the nemesis of commit 1235cee (before the etcd cluster's lane).
//
// InTx, added later, comes from a generator of its own: the fields that
// existed then must still be what they were, so the fingerprint is over
// those.
func TestPlanWithoutPartitionsUnchanged(t *testing.T) {
	// The fields of commit 1235cee's plannedFault, in its order.
	type raw struct {
		Kind     faultKind
		At, Dur  time.Duration
		AfterAck bool
		Leader   bool
		Slot     int
	}
	h := sha256.New()
	for i := range 200 {
		for _, f := range planHistory(42, i, defaultNemesis(), time.Second, 2500*time.Millisecond, 3) {
			fmt.Fprintf(h, "%d %+v\n", i, raw{f.Kind, f.At, f.Dur, f.AfterAck, f.Leader, f.Slot})
		}
	}
	if got, want := hex.EncodeToString(h.Sum(nil)), "b1f8e723a8627f4352ba51c9755ad9ba1f5243849bfa01a0098cfc91c63b7335"; got != want {
		t.Errorf("the schedules of seed 42 changed (fingerprint %s, want %s): old seeds would not replay; history 0 is now %+v",
			got, want, planHistory(42, 0, defaultNemesis(), time.Second, 2500*time.Millisecond, 3)[0])
	}
}

// The cluster's rotation puts a leader kill, a partition and a pause in
// the first three histories (the short run), and a partition lasts 1-3 TTL.
func TestClusterNemesis(t *testing.T) {
	nc := clusterNemesis()
	var first []faultKind
	for i := range 3 {
		first = append(first, planHistory(7, i, nc, time.Second, 3*time.Second, 3)[0].Kind)
	}
	if want := []faultKind{faultCrash, faultPartition, faultPause}; !slices.Equal(first, want) {
		t.Errorf("the first three histories start with %v, want %v", first, want)
	}
	partitions := 0
	for i := range 200 {
		for _, f := range planHistory(7, i, nc, time.Second, 3*time.Second, 3) {
			if f.Kind != faultPartition {
				continue
			}
			partitions++
			if f.Dur < time.Second || f.Dur > 3*time.Second {
				t.Errorf("history %d: %v: a partition lasts 1-3 TTL", i, f)
			}
		}
	}
	if partitions < 40 {
		t.Errorf("%d partitions in 200 histories, want at least one in every fifth", partitions)
	}
	for i := range 200 {
		for _, f := range planHistory(7, i, defaultNemesis(), time.Second, 3*time.Second, 3) {
			if f.Kind == faultPartition {
				t.Errorf("history %d: the default nemesis drew a partition: %v", i, f)
			}
		}
	}
}

// A holder frozen inside its fenced write (token 1) while another takes
// over: the new holder's Advance (token 2) must not wait for it.
func frozenHolderHistory(advanceTook int64) (*hist, Snapshot) {
	h := &hist{}
	h.acquire(1, "h1", 1, 0, 1)
	h.advance(1, 1, OutAccepted, 1, 2, 3)
	h.write(1, 1, 0b0011, "a1", OutUnknown, 0, 100, 1500) // frozen inside, its session ended meanwhile
	h.fault(faultPause, 1, 110, 1400)
	h.acquire(2, "h2", 2, 700, 701)
	h.advance(2, 2, OutAccepted, 2, 710, 710+advanceTook)
	final := h.read(2, [NumParts]Cell{}, 2000, 2001)
	return h, final
}

func TestFenceWaitCatchesAdvanceBehindFrozenHolder(t *testing.T) {
	h, final := frozenHolderHistory(900)
	res := check(t, h, final, nil, false)
	expectCheckers(t, res, chkFenceWait)
	if res.waits.checked[waitAdvances] != 1 {
		t.Errorf("checked advances %d, want 1", res.waits.checked[waitAdvances])
	}

	h, final = frozenHolderHistory(20) // the fence let it through at once
	res = check(t, h, final, nil, false)
	expectCheckers(t, res)
	if got := res.waits.took[waitAdvances]; !slices.Equal(got, []time.Duration{20 * time.Millisecond}) {
		t.Errorf("advances took %v, want [20ms]", got)
	}
}

func TestFenceWaitExplained(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(h *hist)
		why   string
	}{
		{"its own holder paused", func(h *hist) { h.fault(faultPause, 2, 800, 1200) }, whyOwnFault},
		{"its own proxy held", func(h *hist) { h.fault(faultDelay, 2, 650, 900) }, whyOwnFault},
		{"a server crash", func(h *hist) { h.fault(faultCrash, 0, 720, 900) }, whyServer},
		{"a server crash just before", func(h *hist) { h.fault(faultCrash, 0, 300, 500) }, whyServer},
		{"a stall of the server: a read as slow", func(h *hist) {
			snap := Snapshot{Floor: 1}
			h.add(Op{Client: 0, Holder: "reader", Kind: KindRead, Outcome: OutOK, Read: &snap, Invoke: 800, Return: 1290})
		}, whyStall},
		{"a stall of the server: another holder's renewal as slow", func(h *hist) {
			h.add(Op{Client: 3, Holder: holderName(3), Kind: KindRenew, Token: 0, Outcome: OutOK, Invoke: 750, Return: 1300})
		}, whyStall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, final := frozenHolderHistory(900)
			tc.fault(h)
			res := check(t, h, final, nil, false)
			expectCheckers(t, res)
			if res.waits.explained[tc.why] != 1 {
				t.Errorf("explained: %v, want %s 1", res.waits.explained, tc.why)
			}
		})
	}
	// The frozen holder's own renewal, frozen with it, is no witness of a
	// stall.
	h, final := frozenHolderHistory(900)
	h.add(Op{Client: 1, Holder: holderName(1), Kind: KindRenew, Token: 1, Outcome: OutLost, Invoke: 105, Return: 1450})
	expectCheckers(t, check(t, h, final, nil, false), chkFenceWait)

	// Nobody older was open: a slow advance is not a wait for one.
	h = &hist{}
	h.acquire(1, "h1", 1, 0, 1)
	h.advance(1, 1, OutAccepted, 1, 2, 900)
	res := check(t, h, h.read(1, [NumParts]Cell{}, 1000, 1001), nil, false)
	expectCheckers(t, res)
	if res.waits.checked != [2]int{} {
		t.Errorf("checked %v, want none", res.waits.checked)
	}
}

// A newer write may wait for the rows an older holder's open write locked
// (parts in common), not for anything else.
func TestFenceWaitWritesAndRowLocks(t *testing.T) {
	for _, tc := range []struct {
		mask uint8
		want []string
	}{
		{0b0010, nil},                    // part p1 in common: the row locks explain it
		{0b1100, []string{chkFenceWait}}, // nothing in common: only the fence could have held it
	} {
		h, _ := frozenHolderHistory(20)
		h.ops = h.ops[:len(h.ops)-1] // the read
		h.write(2, 2, tc.mask, "b1", OutAccepted, 2, 740, 1600)
		var cells [NumParts]Cell
		for _, p := range maskParts(tc.mask) {
			cells[p] = Cell{2, "b1"}
		}
		final := h.read(2, cells, 2000, 2001)
		res := check(t, h, final, nil, false)
		expectCheckers(t, res, tc.want...)
		if res.waits.checked[waitWrites] != 1 {
			t.Errorf("mask %04b: checked writes %d, want 1", tc.mask, res.waits.checked[waitWrites])
		}
		// etcd: a Txn locks nothing, so no write explains another's wait.
		res = checkHistory(h.ops, h.faults, final, newI2Run(), 0, checkOptions{linTimeout: 10 * time.Second, fenceWait: fenceWaitBound})
		expectCheckers(t, res, chkFenceWait)
	}
}

// A killed holder's operation stays open until the kill, not for ever.
func TestFenceWaitKilledHolder(t *testing.T) {
	h := &hist{}
	h.acquire(1, "h1", 1, 0, 1)
	h.write(1, 1, 0b0001, "a1", OutUnknown, 0, 100, 0) // never returned
	h.fault(faultKill, 1, 150, 160)
	h.acquire(2, "h2", 2, 700, 701)
	h.advance(2, 2, OutAccepted, 2, 710, 1400)
	res := check(t, h, h.read(2, [NumParts]Cell{}, 2000, 2001), nil, false)
	expectCheckers(t, res)
	if res.waits.checked != [2]int{} {
		t.Errorf("checked %v, want none: the killed holder's write ended at its kill", res.waits.checked)
	}
}

// About a quarter of the fence's pauses strike inside a fenced
// transaction, drawn per seed and history; no other kind does.
func TestPlanInTx(t *testing.T) {
	pauses, inTx := 0, 0
	for i := range 400 {
		for _, f := range planHistory(42, i, defaultNemesis(), time.Second, 2500*time.Millisecond, 3) {
			switch {
			case f.Kind == faultPause:
				pauses++
				if f.InTx {
					inTx++
				}
			case f.InTx:
				t.Errorf("history %d: %v is InTx, which only a pause can be", i, f)
			}
		}
	}
	if share := float64(inTx) / float64(pauses); share < 0.15 || share > 0.35 {
		t.Errorf("%d of %d pauses inside a transaction (%.2f), want about a quarter", inTx, pauses, share)
	}
	// The short run (3 histories) has one: the rotation's first pause.
	for _, nc := range []nemesisConfig{defaultNemesis(), clusterNemesis()} {
		found := false
		for i := range 3 {
			f := planHistory(42, i, nc, time.Second, 2500*time.Millisecond, 3)[0]
			found = found || (f.Kind == faultPause && f.InTx)
		}
		if !found {
			t.Errorf("rotation %v: no pause inside a transaction in the first three histories", nc.kinds)
		}
	}
	nc := defaultNemesis()
	nc.kinds, nc.inTx = []faultKind{faultPause}, 1
	for _, f := range planHistory(42, 3, nc, time.Second, 2500*time.Millisecond, 3) {
		if !f.InTx {
			t.Errorf("inTx 1: %v is not InTx", f)
		}
	}
}
