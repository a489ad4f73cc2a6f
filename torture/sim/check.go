package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The checkers' names, as the figures and the seeded-bug controls name
// them (the same names as the torture run's checkers in ../check.go).
const (
	chkI2Reuse = "I2 token reuse"          // two granted acquires of one name got one token
	chkI2Order = "I2 real-time order"      // an acquire invoked after another was granted got a smaller token
	chkI3      = "I3 real time"            // a write below an acknowledged token, invoked after the acknowledgement, accepted
	chkLost    = "acknowledged write lost" // a read or the final state shows less than an acknowledged write
	chkFinal   = "final state"             // the final state is not what the accepted writes leave
)

// violation is one broken rule, with the operations that show it.
type violation struct {
	checker, detail string
}

func (v violation) String() string { return v.checker + ": " + v.detail }

// shownPerChecker bounds the violations kept with their detail: a seeded
// bug can break a rule thousands of times in a run, and the first few say
// what happened.
const shownPerChecker = 5

// verdict is what the checkers found: how many violations of each checker,
// and the first few of each in full.
type verdict struct {
	counts map[string]int
	shown  []violation
}

func (v *verdict) add(checker, format string, args ...any) {
	if v.counts == nil {
		v.counts = map[string]int{}
	}
	v.counts[checker]++
	if v.counts[checker] <= shownPerChecker {
		v.shown = append(v.shown, violation{checker, fmt.Sprintf(format, args...)})
	}
}

func (v verdict) total() int {
	n := 0
	for _, c := range v.counts {
		n += c
	}
	return n
}

func (v verdict) String() string {
	if v.total() == 0 {
		return "no violations"
	}
	var b strings.Builder
	names := make([]string, 0, len(v.counts))
	for name := range v.counts {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s x%d", name, v.counts[name])
	}
	for _, s := range v.shown {
		b.WriteString("\n\t")
		b.WriteString(s.String())
	}
	return b.String()
}

// check runs every checker over a run's log and the final state of each
// scope (final[s] is scope s, read at its location after the run). It reads
// nothing else: the checkers are the same whatever produced the history.
//
//   - I2, per lease name: no two granted acquires share a token (across
//     failovers: the log does not say which server granted them), and an
//     acquire invoked after another one was granted got a larger token.
//   - I3, per scope, across servers and moves: once a write with token t
//     was acknowledged as accepted — at whichever location — no write with
//     a smaller token invoked after that acknowledgement is accepted
//     anywhere.
//   - Acknowledged write lost: a read invoked after a write was
//     acknowledged shows a floor and a data token at least as large, and so
//     does the final state.
//   - Final state: the floor is the largest accepted token (or a larger one
//     of a write whose outcome is unknown), and the data is the content of
//     the last accepted write with the largest token (or of an unknown write
//     with a token at least as large); never a refused write's.
//
//go:norace
func check(log []op, final []scopeState) verdict {
	var v verdict
	n := len(final)
	acquires := make([][]int32, n)
	accepted := make([][]int32, n)
	reads := make([][]int32, n)
	for i, o := range log {
		if int(o.scope) < 0 || int(o.scope) >= n {
			continue
		}
		switch {
		case o.kind == kAcquire && o.out == oOK:
			acquires[o.scope] = append(acquires[o.scope], int32(i))
		case o.kind == kWrite && o.out == oAccepted:
			accepted[o.scope] = append(accepted[o.scope], int32(i))
		case o.kind == kRead && o.out == oOK:
			reads[o.scope] = append(reads[o.scope], int32(i))
		}
	}
	for s := range n {
		checkI2(log, acquires[s], &v)
		checkI3(log, accepted[s], &v)
		checkReads(log, accepted[s], reads[s], &v)
	}
	checkFinal(log, accepted, final, &v)
	return v
}

//go:norace
func byInvoke(log []op, ids []int32) []int32 {
	c := slices.Clone(ids)
	slices.SortStableFunc(c, func(a, b int32) int { return cmp.Compare(log[a].invoke, log[b].invoke) })
	return c
}

//go:norace
func byReturn(log []op, ids []int32) []int32 {
	c := slices.Clone(ids)
	slices.SortStableFunc(c, func(a, b int32) int { return cmp.Compare(log[a].ret, log[b].ret) })
	return c
}

// checkI2 checks one name's granted acquires.
//
//go:norace
func checkI2(log []op, acq []int32, v *verdict) {
	byToken := slices.Clone(acq)
	slices.SortStableFunc(byToken, func(a, b int32) int { return cmp.Compare(log[a].token, log[b].token) })
	for i := 1; i < len(byToken); i++ {
		a, b := log[byToken[i-1]], log[byToken[i]]
		if a.token == b.token {
			v.add(chkI2Reuse, "token %d granted twice: %v; %v", b.token, a, b)
		}
	}
	// Sweep the acquires in invocation order, keeping the largest token of
	// those granted before the current one was invoked.
	ret := byReturn(log, acq)
	best, j := int32(-1), 0
	for _, b := range byInvoke(log, acq) {
		for ; j < len(ret) && log[ret[j]].ret < log[b].invoke; j++ {
			if best < 0 || log[ret[j]].token > log[best].token {
				best = ret[j]
			}
		}
		if best >= 0 && log[best].token > log[b].token {
			v.add(chkI2Order, "%v, invoked after %v", log[b], log[best])
		}
	}
}

// checkI3 checks one scope's accepted writes, wherever they were accepted.
//
//go:norace
func checkI3(log []op, acc []int32, v *verdict) {
	ret := byReturn(log, acc)
	best, j := int32(-1), 0
	for _, b := range byInvoke(log, acc) {
		for ; j < len(ret) && log[ret[j]].ret < log[b].invoke; j++ {
			if best < 0 || log[ret[j]].token > log[best].token {
				best = ret[j]
			}
		}
		if best >= 0 && log[best].token > log[b].token {
			v.add(chkI3, "%v, invoked %v after %v", log[b], log[b].invoke-log[best].ret, log[best])
		}
	}
}

// checkReads checks that every read of one scope shows every write
// acknowledged before the read was invoked.
//
//go:norace
func checkReads(log []op, acc, reads []int32, v *verdict) {
	ret := byReturn(log, acc)
	best, j := int32(-1), 0
	for _, r := range byInvoke(log, reads) {
		for ; j < len(ret) && log[ret[j]].ret < log[r].invoke; j++ {
			if best < 0 || log[ret[j]].token > log[best].token {
				best = ret[j]
			}
		}
		if best >= 0 && (log[r].floor < log[best].token || log[r].token < log[best].token) {
			v.add(chkLost, "%v, invoked %v after %v", log[r], log[r].invoke-log[best].ret, log[best])
		}
	}
}

// checkFinal checks each scope's final state against its writes.
//
//go:norace
func checkFinal(log []op, accepted [][]int32, final []scopeState, v *verdict) {
	// The write whose content each scope ends with, and the tokens of the
	// writes with an unknown outcome (one of them may have set the floor).
	src := make([]int32, len(final))
	for s := range src {
		src[s] = -1
	}
	unknown := make([]map[uint64]bool, len(final))
	for i, o := range log {
		if o.kind != kWrite || int(o.scope) < 0 || int(o.scope) >= len(final) {
			continue
		}
		if f := final[o.scope]; f.content != 0 && o.content == f.content {
			src[o.scope] = int32(i)
		}
		if o.out == oUnknown {
			if unknown[o.scope] == nil {
				unknown[o.scope] = map[uint64]bool{}
			}
			unknown[o.scope][o.token] = true
		}
	}
	for s, f := range final {
		var maxAcc uint64
		last := int32(-1) // the accepted write of token maxAcc invoked last
		for _, i := range accepted[s] {
			if last < 0 || log[i].token > maxAcc || (log[i].token == maxAcc && log[i].invoke > log[last].invoke) {
				maxAcc, last = log[i].token, i
			}
		}
		if f.floor < maxAcc || f.token < maxAcc {
			v.add(chkLost, "scope %d ends with floor %d and data #%d of token %d, but %v was acknowledged",
				s, f.floor, f.content, f.token, log[last])
			continue
		}
		if f.floor > maxAcc && !unknown[s][f.floor] {
			v.add(chkFinal, "scope %d ends with floor %d, but the largest accepted token is %d and no write of token %d has an unknown outcome",
				s, f.floor, maxAcc, f.floor)
		}
		if f.content == 0 {
			continue // never written (else the floor or token check above fired)
		}
		i := src[s]
		if i < 0 || log[i].token != f.token {
			v.add(chkFinal, "scope %d ends with data #%d of token %d, which no write of that token to that scope produced", s, f.content, f.token)
			continue
		}
		o := log[i]
		switch {
		case o.out != oAccepted && o.out != oUnknown:
			v.add(chkFinal, "scope %d ends with the content of a refused write: %v", s, o)
		case o.out == oAccepted && i != last && o.token == maxAcc && log[last].invoke > o.ret:
			v.add(chkFinal, "scope %d ends with %v, overwritten by %v afterwards", s, o, log[last])
		}
	}
}
