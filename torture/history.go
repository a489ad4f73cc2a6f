package torture

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// NumParts is how many parts the scope has. Every write covers a non-empty
// subset of them, in both tables, so a fence kept per part rather than per
// scope would be told apart from the scope's fence.
const NumParts = 4

// tableNames are the two user tables (PostgreSQL) or key families (etcd)
// every write puts its parts into, in one transaction.
var tableNames = [2]string{"run", "line"}

// partName is the name of part i in both tables.
func partName(i int) string { return fmt.Sprintf("p%d", i) }

// partIndex is the inverse of partName; -1 for a name that is not a part.
func partIndex(name string) int {
	for i := range NumParts {
		if partName(i) == name {
			return i
		}
	}
	return -1
}

// maskParts lists the parts a write mask covers.
func maskParts(mask uint8) []int {
	var ps []int
	for i := range NumParts {
		if mask&(1<<i) != 0 {
			ps = append(ps, i)
		}
	}
	return ps
}

// Kind is what an operation does.
type Kind string

const (
	KindAcquire Kind = "acquire" // lease Acquire (through Campaign)
	KindRenew   Kind = "renew"   // lease Renew (the session's renewal)
	KindRelease Kind = "release" // lease Release
	KindAdvance Kind = "advance" // fence Advance: raise the floor, no data
	KindWrite   Kind = "write"   // user data of the scope under the fence
	KindRead    Kind = "read"    // the parent reads the floor and both tables in one snapshot
)

// Outcome is how an operation ended.
type Outcome string

const (
	OutOK       Outcome = "ok"       // acquire, renew, release, read succeeded
	OutHeld     Outcome = "held"     // acquire refused: another holding period runs (ErrHeld)
	OutLost     Outcome = "lost"     // renew or release refused: the hold is over (ErrLost)
	OutAccepted Outcome = "accepted" // the fence let the write (or advance) through
	OutRejected Outcome = "rejected" // the fence refused it; nothing was written
	// OutUnknown: the connection broke, the request timed out, or the
	// process was killed while the operation was in flight: it may or may
	// not have taken effect, at any time after its invocation.
	OutUnknown Outcome = "unknown"
)

// Cell is one part of one table as stored: the token and content of the
// write that put it there. The zero Cell is an absent part.
type Cell struct {
	Token   uint64 `json:"token,omitempty"`
	Content string `json:"content,omitempty"`
}

func (c Cell) String() string {
	if c == (Cell{}) {
		return "-"
	}
	return fmt.Sprintf("%d:%s", c.Token, c.Content)
}

// Snapshot is what a read returns: the scope's floor and both tables, read
// at one point (one statement on PostgreSQL, one Txn on etcd).
type Snapshot struct {
	Floor  uint64            `json:"floor"`
	Tables [2][NumParts]Cell `json:"tables"`
}

// Op is one operation of a history, with its times on CLOCK_MONOTONIC.
type Op struct {
	ID      int    `json:"id"`
	Client  int    `json:"client"` // porcupine's lane: 0 is the parent's reader, then one per holder incarnation
	Holder  string `json:"holder"`
	Kind    Kind   `json:"kind"`
	Invoke  int64  `json:"invoke"`
	Return  int64  `json:"return"` // 0: never returned (the holder was killed with it in flight)
	Token   uint64 `json:"token,omitempty"`
	Mask    uint8  `json:"mask,omitempty"`
	Content string `json:"content,omitempty"`

	Outcome Outcome   `json:"outcome"`
	Floor   uint64    `json:"floor,omitempty"` // the fence's result floor
	Read    *Snapshot `json:"read,omitempty"`
	Err     string    `json:"err,omitempty"`

	// A write's time inside its transaction, as its holder reported it:
	// TxBegin when it was inside (PostgreSQL: the first table's statement
	// done, the in-transaction work next; etcd: its Txn about to be sent),
	// TxEnd when its own statements were done and the commit came next
	// (PostgreSQL only; 0: inside until it returned). 0: never inside.
	TxBegin int64 `json:"tx_begin,omitempty"`
	TxEnd   int64 `json:"tx_end,omitempty"`
}

// inTxAt reports whether the write was inside its transaction at t.
func (o *Op) inTxAt(t int64) bool {
	if o.TxBegin == 0 || t < o.TxBegin {
		return false
	}
	end := o.TxEnd
	if end == 0 {
		end = o.Return
	}
	return end == 0 || t <= end
}

// known reports whether the operation's outcome is known: answered, and
// not unknown.
func (o *Op) known() bool { return o.Return != 0 && o.Outcome != OutUnknown }

// fenceOp reports whether the operation is checked by the fence (advance
// or write).
func (o *Op) fenceOp() bool { return o.Kind == KindAdvance || o.Kind == KindWrite }

func (o *Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %s", o.ID, o.Holder, o.Kind)
	if o.Token != 0 {
		fmt.Fprintf(&b, " token=%d", o.Token)
	}
	if o.Kind == KindWrite {
		fmt.Fprintf(&b, " parts=%v content=%s", maskParts(o.Mask), o.Content)
	}
	fmt.Fprintf(&b, " -> %s", o.Outcome)
	if o.Floor != 0 {
		fmt.Fprintf(&b, " floor=%d", o.Floor)
	}
	if o.Read != nil {
		fmt.Fprintf(&b, " floor=%d %v", o.Read.Floor, o.Read.Tables)
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " (%s)", o.Err)
	}
	return b.String()
}

// event is one line a holder process writes about an operation: its
// invocation ("i", with the inputs), a write's moments inside its
// transaction ("t": inside, "d": its own statements done, the commit
// next), or its completion ("c", with the outcome). Seq pairs them within
// one holder process.
type event struct {
	Phase   string  `json:"p"`
	History int     `json:"h"`
	Seq     int     `json:"s"`
	Kind    Kind    `json:"k,omitempty"`
	T       int64   `json:"t"`
	Token   uint64  `json:"tok,omitempty"`
	Mask    uint8   `json:"m,omitempty"`
	Content string  `json:"c,omitempty"`
	Outcome Outcome `json:"o,omitempty"`
	Floor   uint64  `json:"f,omitempty"`
	Err     string  `json:"e,omitempty"`
}

// faultRecord is one injected fault, for the figures and the
// visualization.
type faultRecord struct {
	Kind   faultKind `json:"kind"`
	Target string    `json:"target,omitempty"` // the holder, "" for the server (a partition: the member)
	Start  int64     `json:"start"`
	End    int64     `json:"end"`
	Note   string    `json:"note,omitempty"`
	InTx   bool      `json:"in_tx,omitempty"` // a pause aimed inside a fenced transaction (plannedFault.InTx)
	// OnReport: an InTx pause that struck on its holder's report of being
	// inside (not the fallback after 2 TTL without one).
	OnReport bool `json:"on_report,omitempty"`
}

// serverFault reports whether the fault is the server's (a crash, on a
// cluster a leader kill, or a partition) rather than one holder's.
func (f faultRecord) serverFault() bool { return f.Kind == faultCrash || f.Kind == faultPartition }

// recorder collects one history's operations from the holders' event
// lines and the parent's reads.
type recorder struct {
	mu      sync.Mutex
	history int
	ops     []*Op
	pending map[[2]int]*Op // (client, seq) -> invoked, not completed
	faults  []faultRecord
	// leaderClient is the client whose acquire succeeded last: the
	// nemesis's favourite target.
	leaderClient int
	// ack is signalled whenever a fence operation is acknowledged as
	// accepted, by who made it: the nemesis waits on it to strike right
	// after an acknowledged write. inTx is signalled whenever a write
	// reports being inside its transaction: the nemesis waits on it to
	// strike there.
	ack, inTx broadcast
	stray     int // events of another history (should not happen)
}

// broadcast tells every waiter "it happened, client did it": ch is
// closed, and replaced, each time. Guarded by the recorder's mutex.
type broadcast struct {
	ch     chan struct{}
	client int
}

func (s *broadcast) fire(client int) {
	s.client = client
	close(s.ch)
	s.ch = make(chan struct{})
}

func newRecorder(history int) *recorder {
	return &recorder{history: history, pending: map[[2]int]*Op{}, leaderClient: -1,
		ack: broadcast{ch: make(chan struct{})}, inTx: broadcast{ch: make(chan struct{})}}
}

// add records a holder's event.
func (r *recorder) add(client int, holder string, ev event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.History != r.history {
		r.stray++
		return
	}
	key := [2]int{client, ev.Seq}
	switch ev.Phase {
	case "i":
		op := &Op{ID: len(r.ops), Client: client, Holder: holder, Kind: ev.Kind, Invoke: ev.T,
			Token: ev.Token, Mask: ev.Mask, Content: ev.Content, Outcome: OutUnknown}
		r.ops = append(r.ops, op)
		r.pending[key] = op
	case "t", "d":
		op := r.pending[key]
		if op == nil {
			r.stray++
			return
		}
		if ev.Phase == "d" {
			op.TxEnd = ev.T
			return
		}
		op.TxBegin = ev.T
		r.inTx.fire(client)
	case "c":
		op := r.pending[key]
		if op == nil {
			r.stray++
			return
		}
		delete(r.pending, key)
		op.Return, op.Outcome, op.Floor, op.Err = ev.T, ev.Outcome, ev.Floor, ev.Err
		if op.Kind == KindAcquire {
			op.Token = ev.Token // an acquire's token is known only on completion
		}
		if op.Kind == KindAcquire && op.Outcome == OutOK {
			r.leaderClient = client
		}
		if op.fenceOp() && op.Outcome == OutAccepted {
			r.ack.fire(client)
		}
	}
}

// addRead records a read of the parent.
func (r *recorder) addRead(op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.ops)
	r.ops = append(r.ops, &op)
}

func (r *recorder) addFault(f faultRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
}

// nextAck waits up to timeout for the next acknowledged fence operation
// and returns its client.
func (r *recorder) nextAck(ctx context.Context, timeout time.Duration) (client int, ok bool) {
	return r.wait(ctx, &r.ack, timeout)
}

// nextInTx waits up to timeout for the next write to report being inside
// its transaction and returns its client.
func (r *recorder) nextInTx(ctx context.Context, timeout time.Duration) (client int, ok bool) {
	return r.wait(ctx, &r.inTx, timeout)
}

func (r *recorder) wait(ctx context.Context, s *broadcast, timeout time.Duration) (client int, ok bool) {
	r.mu.Lock()
	ch := s.ch
	r.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		r.mu.Lock()
		defer r.mu.Unlock()
		return s.client, true
	case <-t.C:
	case <-ctx.Done():
	}
	return -1, false
}

func (r *recorder) leader() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leaderClient
}

// finish returns the operations, those still pending marked as never
// returned, ordered by invocation, and how many events belonged to no
// operation of this history (a harness bug if any).
func (r *recorder) finish() ([]*Op, []faultRecord, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.pending {
		op.Return, op.Outcome = 0, OutUnknown
	}
	r.pending = map[[2]int]*Op{}
	ops := slices.Clone(r.ops)
	slices.SortStableFunc(ops, func(a, b *Op) int { return compareInt64(a.Invoke, b.Invoke) })
	// Clients numbered 0 (the reader), 1, 2, ... in the order they first
	// appear: porcupine draws one row per client id.
	clients := map[int]int{0: 0}
	for i, op := range ops {
		op.ID = i
		c, ok := clients[op.Client]
		if !ok {
			c = len(clients)
			clients[op.Client] = c
		}
		op.Client = c
	}
	return ops, slices.Clone(r.faults), r.stray
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
