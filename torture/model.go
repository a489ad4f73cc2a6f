package torture

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The fenced register: the sequential specification the fence promises
// for one scope. Its state is the floor (the largest token the fence let
// through) and the cell of every part (both tables hold the same cells:
// one write puts its parts into both in one transaction).
//
//	advance(t):         t >= floor: floor = t, accepted; else rejected, reporting the floor
//	write(t, parts, c): t >= floor: floor = t, each part = (t, c), accepted; else rejected
//	read():             returns the floor and both tables
//
// An operation whose outcome is unknown branches: the model continues both
// from the state where it took effect (when it could have: t >= floor) and
// from the state where it did not. Its return time is after the end of the
// history, so it may also take effect after everything else (a request
// sent before the holder was killed can still be applied by the server).
type regState struct {
	Floor uint64
	Parts [NumParts]Cell
}

type regInput struct {
	Kind    Kind
	Token   uint64
	Mask    uint8
	Content string
}

type regOutput struct {
	Outcome Outcome
	Floor   uint64
	Read    Snapshot // for reads
}

// regStep is the register's step. readFloor false leaves the floor out of
// reads: the unfenced control has no floor to read, yet the tokens of what
// it accepts must still never go back.
func regStep(state, input, output any, readFloor bool) []any {
	s := state.(regState)
	in := input.(regInput)
	out := output.(regOutput)
	if in.Kind == KindRead {
		if (readFloor && out.Read.Floor != s.Floor) || out.Read.Tables[0] != s.Parts || out.Read.Tables[1] != s.Parts {
			return nil
		}
		return []any{s}
	}
	apply := func() regState {
		n := s
		n.Floor = in.Token
		if in.Kind == KindWrite {
			for _, p := range maskParts(in.Mask) {
				n.Parts[p] = Cell{Token: in.Token, Content: in.Content}
			}
		}
		return n
	}
	allowed := in.Token >= s.Floor
	switch out.Outcome {
	case OutAccepted:
		if allowed {
			return []any{apply()}
		}
	case OutRejected:
		// The fence reports the floor that beat the token, read in the same
		// atomic step as its decision (the check statement on PostgreSQL,
		// the read that follows a failed guard on etcd, floors only rising).
		if !allowed && out.Floor == s.Floor {
			return []any{s}
		}
	case OutUnknown:
		if allowed {
			return []any{apply(), s}
		}
		return []any{s}
	}
	return nil
}

func regHash(state any) uint64 {
	s := state.(regState)
	h := fnv.New64a()
	fmt.Fprintf(h, "%d", s.Floor)
	for _, c := range s.Parts {
		fmt.Fprintf(h, "|%d:%s", c.Token, c.Content)
	}
	return h.Sum64()
}

func describeState(state any) string {
	s := state.(regState)
	var b strings.Builder
	fmt.Fprintf(&b, "floor %d |", s.Floor)
	for i, c := range s.Parts {
		fmt.Fprintf(&b, " %s=%s", partName(i), c)
	}
	return b.String()
}

func describeOp(input, output any) string {
	in := input.(regInput)
	out := output.(regOutput)
	switch in.Kind {
	case KindRead:
		var b strings.Builder
		fmt.Fprintf(&b, "read -> floor %d |", out.Read.Floor)
		for i := range NumParts {
			fmt.Fprintf(&b, " %s=%s", partName(i), out.Read.Tables[0][i])
			if out.Read.Tables[1][i] != out.Read.Tables[0][i] {
				fmt.Fprintf(&b, "/line:%s", out.Read.Tables[1][i])
			}
		}
		return b.String()
	case KindAdvance:
		return fmt.Sprintf("advance(%d) -> %s", in.Token, describeOutcome(out))
	}
	names := make([]string, 0, NumParts)
	for _, p := range maskParts(in.Mask) {
		names = append(names, partName(p))
	}
	return fmt.Sprintf("write(%d, %s, %s) -> %s", in.Token, strings.Join(names, "+"), in.Content, describeOutcome(out))
}

func describeOutcome(out regOutput) string {
	if out.Outcome == OutRejected {
		return fmt.Sprintf("rejected, floor %d", out.Floor)
	}
	return string(out.Outcome)
}

// registerModelFor returns the fenced register as a porcupine model;
// noFloor leaves the floor out of reads (see regStep).
func registerModelFor(noFloor bool) porcupine.Model {
	if noFloor {
		return registerModelNoFloor
	}
	return registerModel
}

var (
	registerModel        = newRegisterModel(true)
	registerModelNoFloor = newRegisterModel(false)
)

func newRegisterModel(readFloor bool) porcupine.Model {
	return (&porcupine.NondeterministicModel{
		Init:              func() []any { return []any{regState{}} },
		Step:              func(s, in, out any) []any { return regStep(s, in, out, readFloor) },
		Equal:             func(a, b any) bool { return a.(regState) == b.(regState) },
		Hash:              regHash,
		DescribeOperation: describeOp,
		DescribeState:     describeState,
		DescribeOperationMetadata: func(info any) string {
			if info == nil {
				return ""
			}
			return fmt.Sprint(info)
		},
	}).ToModel()
}

// porcupineHistory turns a history's fence operations and reads into
// porcupine operations. Lease operations are not part of the register;
// they appear in the visualization as annotations. An operation with an
// unknown outcome returns after everything else (end).
func porcupineHistory(ops []*Op) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Invoke, op.Return)
	}
	end++
	stream := streams(ops)
	var out []porcupine.Operation
	for _, op := range ops {
		if !op.fenceOp() && op.Kind != KindRead {
			continue
		}
		if op.Kind == KindRead && (op.Read == nil || op.Outcome != OutOK) {
			continue // a failed read says nothing
		}
		ret := op.Return
		o := regOutput{Outcome: op.Outcome, Floor: op.Floor}
		if op.Return == 0 || op.Outcome == OutUnknown {
			ret, o.Outcome = end, OutUnknown
		}
		if op.Read != nil {
			o.Read = *op.Read
		}
		out = append(out, porcupine.Operation{
			ClientId: stream[op.ID],
			Input:    regInput{Kind: op.Kind, Token: op.Token, Mask: op.Mask, Content: op.Content},
			Call:     op.Invoke,
			Output:   o,
			Return:   ret,
			Metadata: fmt.Sprintf("op #%d by %s", op.ID, op.Holder),
		})
	}
	return out
}

// streams maps each operation (by ID) to the row porcupine draws it on.
// porcupine draws one row per client id and expects a client's operations
// one after another, but an operation whose outcome is unknown has no end:
// the holder's later operations go to a new row, as etcd's robustness
// tests do with a failed request.
func streams(ops []*Op) map[int]int {
	next := 0
	for _, op := range ops {
		next = max(next, op.Client+1)
	}
	cur := map[int]int{}
	out := make(map[int]int, len(ops))
	for _, op := range ops {
		s, ok := cur[op.Client]
		if !ok {
			s = op.Client
			cur[op.Client] = s
		}
		out[op.ID] = s
		if op.fenceOp() && !op.known() {
			cur[op.Client] = next
			next++
		}
	}
	return out
}

// annotations are the lease operations and the faults of a history, for the
// visualization: what porcupine does not check but a reader needs.
func annotations(ops []*Op, faults []faultRecord) []porcupine.Annotation {
	var as []porcupine.Annotation
	stream := streams(ops)
	for _, op := range ops {
		if op.Kind != KindAcquire || op.Outcome != OutOK {
			continue
		}
		as = append(as, porcupine.Annotation{ClientId: stream[op.ID], Start: op.Invoke, End: op.Return,
			Description: fmt.Sprintf("acquired token %d", op.Token), BackgroundColor: "#d8f0d8"})
	}
	for _, f := range faults {
		end := f.End
		if end <= f.Start {
			end = f.Start
		}
		desc := string(f.Kind)
		if f.Target != "" {
			desc += " " + f.Target
		}
		as = append(as, porcupine.Annotation{Tag: "nemesis", Start: f.Start, End: end,
			Description: desc, Details: f.Note, BackgroundColor: "#f6d0d0"})
	}
	return as
}
