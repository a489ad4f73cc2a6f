package torture

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checkers' names, as the figures and the negative controls name them.
const (
	chkI2Reuse = "I2 token reuse"          // two successful acquires got one token
	chkI2Order = "I2 real-time order"      // an acquire that began after another ended got a token not above it
	chkI3      = "I3 real time"            // a write below an acknowledged token, invoked after the acknowledgement, accepted
	chkFinal   = "final state"             // the server's final state is not what the accepted writes leave
	chkLost    = "acknowledged write lost" // a read after an acknowledgement does not show it
	chkAtomic  = "tables disagree"         // one write's two tables seen apart
	chkLin     = "linearizability"         // porcupine: no order of the operations explains the history
	// chkFenceWait: an advance or write of a newer token took longer than
	// the bound while an older holder's was open, and nothing but the
	// fence explains it.
	chkFenceWait = "waited on the fence"
)

// violation is one broken rule, with the operations that show it.
type violation struct {
	Checker string `json:"checker"`
	Detail  string `json:"detail"`
}

func (v violation) String() string { return v.Checker + ": " + v.Detail }

// checkOptions says what the checked design promises.
type checkOptions struct {
	// noFloor: the design has no floor to read (the unfenced control): the
	// floor is not compared, only the tokens of the writes it accepted.
	noFloor bool
	// linTimeout bounds porcupine; running out counts as a violation.
	linTimeout time.Duration
	// fenceWait bounds how long an advance or write of a newer token may
	// take while an older holder's is open (checkFenceWaits); 0: not
	// checked.
	fenceWait time.Duration
	// rowLocks: a write locks the user tables' rows it wrote until its
	// transaction ends (PostgreSQL), which a newer write may wait for.
	rowLocks bool
}

// checkResult is what the checkers found in one history.
type checkResult struct {
	violations []violation
	lin        porcupine.CheckResult
	linInfo    porcupine.LinearizationInfo
	waits      waitStats
	took       time.Duration
}

// checkHistory runs every checker over one history's operations and the
// final snapshot (also the last read among ops). i2 carries the lane's
// acquires of earlier histories: tokens must be unique over the run.
func checkHistory(ops []*Op, faults []faultRecord, final Snapshot, i2 *i2Run, history int, opt checkOptions) checkResult {
	t0 := time.Now()
	var vs []violation
	vs = append(vs, i2.check(history, ops)...)
	vs = append(vs, checkI3(ops)...)
	vs = append(vs, checkFinal(ops, final, opt.noFloor)...)
	vs = append(vs, checkReads(ops, opt.noFloor)...)
	var waits waitStats
	if opt.fenceWait > 0 {
		var wv []violation
		wv, waits = checkFenceWaits(ops, faults, opt.fenceWait, opt.rowLocks)
		vs = append(vs, wv...)
	}
	lin, info := porcupine.CheckOperationsVerbose(registerModelFor(opt.noFloor), porcupineHistory(ops), opt.linTimeout)
	switch lin {
	case porcupine.Illegal:
		vs = append(vs, violation{chkLin, "porcupine: no linearization of the fenced register explains the history (see the visualization)"})
	case porcupine.Unknown:
		vs = append(vs, violation{chkLin, fmt.Sprintf("porcupine found no answer within %v: an unknown verdict counts as a failure", opt.linTimeout)})
	}
	return checkResult{violations: vs, lin: lin, linInfo: info, waits: waits, took: time.Since(t0)}
}

// i2Run is one lease's successful acquires over the whole run (a lane's
// lease outlives its histories, server crashes included).
type i2Run struct {
	acquires []acqRef
	byToken  map[uint64]acqRef
}

type acqRef struct {
	history         int
	holder          string
	token           uint64
	invoke, return_ int64
}

func newI2Run() *i2Run { return &i2Run{byToken: map[uint64]acqRef{}} }

// check adds the history's successful acquires and reports reuse (a token
// granted twice, in this history or an earlier one) and real-time order
// (an acquire that completed before another was invoked must have the
// smaller token).
func (s *i2Run) check(history int, ops []*Op) []violation {
	var fresh []acqRef
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Outcome == OutOK && op.Return != 0 {
			fresh = append(fresh, acqRef{history, op.Holder, op.Token, op.Invoke, op.Return})
		}
	}
	var vs []violation
	for _, b := range fresh {
		if a, dup := s.byToken[b.token]; dup {
			vs = append(vs, violation{chkI2Reuse, fmt.Sprintf("token %d granted to %s (history %d) and again to %s (history %d)",
				b.token, a.holder, a.history, b.holder, b.history)})
			continue
		}
		s.byToken[b.token] = b
	}
	all := append(s.acquires, fresh...)
	for _, b := range fresh {
		for _, a := range all {
			if a.return_ < b.invoke && a.token > b.token {
				vs = append(vs, violation{chkI2Order, fmt.Sprintf("%s (history %d) got token %d after %s (history %d) had got token %d",
					b.holder, b.history, b.token, a.holder, a.history, a.token)})
				break
			}
		}
	}
	s.acquires = all
	return vs
}

// checkI3 reports every accepted fence operation (write or advance) with a
// token below one whose acceptance had been acknowledged before it was
// invoked.
func checkI3(ops []*Op) []violation {
	var acc []*Op
	for _, op := range ops {
		if op.fenceOp() && op.Outcome == OutAccepted && op.Return != 0 {
			acc = append(acc, op)
		}
	}
	var vs []violation
	for _, b := range acc {
		var beat *Op
		for _, a := range acc {
			if a.Return < b.Invoke && a.Token > b.Token && (beat == nil || a.Token > beat.Token) {
				beat = a
			}
		}
		if beat != nil {
			vs = append(vs, violation{chkI3, fmt.Sprintf("%s, invoked %v after %s was acknowledged",
				b, time.Duration(b.Invoke-beat.Return).Round(time.Microsecond), beat)})
		}
	}
	return vs
}

// checkFinal compares the final snapshot with the fence operations: the
// floor is the largest accepted token (or a larger one of an operation
// whose outcome is unknown), and each part of each table holds the content
// of the last accepted write with the largest accepted token that covered
// it (or of an unknown write with a token at least as large).
func checkFinal(ops []*Op, final Snapshot, noFloor bool) []violation {
	var vs []violation
	var maxAcc uint64
	unknown := map[uint64]bool{}
	byContent := map[string]*Op{}
	for _, op := range ops {
		if !op.fenceOp() {
			continue
		}
		switch {
		case op.Outcome == OutAccepted && op.Return != 0:
			maxAcc = max(maxAcc, op.Token)
		case !op.known():
			unknown[op.Token] = true
		}
		if op.Kind == KindWrite {
			byContent[op.Content] = op
		}
	}
	if !noFloor && final.Floor != maxAcc && !(final.Floor > maxAcc && unknown[final.Floor]) {
		vs = append(vs, violation{chkFinal, fmt.Sprintf("final floor %d, but the largest accepted token is %d", final.Floor, maxAcc)})
	}
	for t, table := range tableNames {
		for p := range NumParts {
			cell := final.Tables[t][p]
			var maxP uint64
			var last *Op // the accepted write of token maxP invoked last
			for _, op := range ops {
				if op.Kind == KindWrite && op.Outcome == OutAccepted && op.Return != 0 && op.Mask&(1<<p) != 0 {
					if last == nil || op.Token > maxP || (op.Token == maxP && op.Invoke > last.Invoke) {
						maxP, last = op.Token, op
					}
				}
			}
			where := fmt.Sprintf("part %s of table %s", partName(p), table)
			if cell == (Cell{}) {
				if maxP != 0 {
					vs = append(vs, violation{chkFinal, fmt.Sprintf("%s is absent, but %s was acknowledged", where, last)})
				}
				continue
			}
			src := byContent[cell.Content]
			switch {
			case src == nil || src.Mask&(1<<p) == 0 || src.Token != cell.Token:
				vs = append(vs, violation{chkFinal, fmt.Sprintf("%s holds %s, which no write of that token to that part produced", where, cell)})
			case src.Outcome == OutRejected:
				vs = append(vs, violation{chkFinal, fmt.Sprintf("%s holds the content of a rejected write: %s", where, src)})
			case cell.Token < maxP:
				vs = append(vs, violation{chkFinal, fmt.Sprintf("%s holds token %d (%s), but %s was acknowledged", where, cell.Token, src, last)})
			case cell.Token == maxP && src.known() && src != last && last.Invoke > src.Return:
				vs = append(vs, violation{chkFinal, fmt.Sprintf("%s holds %s, overwritten by %s of the same token afterwards", where, src, last)})
			}
		}
	}
	return vs
}

// checkReads checks every read, the final one included: it must show every
// fence operation acknowledged before the read was invoked (the floor at
// least its token, each part of each table at least the token of the
// acknowledged writes that covered it), and both tables alike. Each lost
// operation is reported once, at the first read that misses it.
func checkReads(ops []*Op, noFloor bool) []violation {
	var reads, acc []*Op
	for _, op := range ops {
		switch {
		case op.Kind == KindRead && op.Outcome == OutOK && op.Read != nil:
			reads = append(reads, op)
		case op.fenceOp() && op.Outcome == OutAccepted && op.Return != 0:
			acc = append(acc, op)
		}
	}
	slices.SortFunc(reads, func(a, b *Op) int { return compareInt64(a.Invoke, b.Invoke) })
	var vs []violation
	lost := map[int]bool{}
	disagreed := false
	for _, r := range reads {
		if r.Read.Tables[0] != r.Read.Tables[1] && !disagreed {
			disagreed = true
			vs = append(vs, violation{chkAtomic, fmt.Sprintf("read #%d: table %s %v, table %s %v",
				r.ID, tableNames[0], r.Read.Tables[0], tableNames[1], r.Read.Tables[1])})
		}
		for _, w := range acc {
			if w.Return >= r.Invoke || lost[w.ID] {
				continue
			}
			missing := ""
			if !noFloor && r.Read.Floor < w.Token {
				missing = fmt.Sprintf("floor %d", r.Read.Floor)
			}
			if w.Kind == KindWrite {
				for t := range tableNames {
					for _, p := range maskParts(w.Mask) {
						if c := r.Read.Tables[t][p]; c.Token < w.Token && missing == "" {
							missing = fmt.Sprintf("part %s of table %s at %s", partName(p), tableNames[t], c)
						}
					}
				}
			}
			if missing != "" {
				lost[w.ID] = true
				vs = append(vs, violation{chkLost, fmt.Sprintf("%s, acknowledged %v before read #%d, which shows %s",
					w, time.Duration(r.Invoke-w.Return).Round(time.Microsecond), r.ID, missing)})
			}
		}
	}
	return vs
}

// countByChecker counts violations per checker.
func countByChecker(vs []violation) map[string]int {
	m := map[string]int{}
	for _, v := range vs {
		m[v.Checker]++
	}
	return m
}
