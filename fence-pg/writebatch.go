package fencepg

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/leasecore"
)

// writeBatcher gathers the fast paths of concurrent Resource.Write calls
// (the floor equals the token) into shared statements, as PostgreSQL's
// group commit gathers their fsyncs: at most maxWritesInFlight fast-path
// statements of one Resource run at once; a write that finds them all
// running queues, and the next statement to start carries every queued
// write (up to maxWriteBatch, one per scope and part) in one
// FencedWriteManyShared and one durable commit. A process writing many
// scopes through one Resource then pays one statement's parsing, planning,
// round trip and commit for many writes instead of one each: with 64
// writers on 2 CPUs that per-statement work, not the fence's floor lookup
// and lock, is most of what a write costs the server (docs/performance.md).
//
// A write that finds a free place runs its own single statement
// (FencedWriteShared) in its own goroutine, so a lone writer's latency is
// unchanged. Only a write that queued is carried by a batch: the batch runs
// in a goroutine that exists only while writes are queued, started by the
// statement that found the queue non-empty when it ended, so a Resource,
// which has no Close, leaves nothing running when idle. Each queued caller
// waits for its own answer or its own ctx; a batch statement is cancelled
// once every caller it carries has stopped waiting, and a caller that left
// has the outcome of a statement whose answer was lost, as with a single
// statement cancelled by ctx.
//
// Neither kind of statement waits on a floor row being raised (SKIP
// LOCKED): the write goes on alone to the full check, outside the places
// counted here, which waits for the raise. So a scope whose floor is held
// by a long transaction (a RunTx of a new holder) delays only its own
// writers, never the other scopes' writes in a batch or behind one.
type writeBatcher struct {
	mu      sync.Mutex
	queue   []*queuedWrite
	running int // fast-path statements running: single writes and batches
}

// queuedWrite is one Write waiting for a batch.
type queuedWrite struct {
	w    leasecore.Write
	ctx  context.Context
	done chan batchAnswer // buffered: an answer never waits for a caller that left
}

// batchAnswer is a queued write's outcome: stored under the fast path, or
// not (the caller runs the full check); alone when the batch statement
// failed, so that the caller runs its own single statement and one bad
// write cannot fail the others (a batch reports no error of its own).
type batchAnswer struct {
	stored bool
	alone  bool
}

// partKey names the row a write upserts: one per batch statement.
type partKey struct{ scope, part string }

const (
	// maxWritesInFlight bounds the fast-path statements of one Resource
	// running at once. Two keep the server busy while one statement waits
	// for its commit's fsync and the other runs; more would only split
	// the queue into smaller batches.
	maxWritesInFlight = 2
	// maxWriteBatch and maxWriteBatchBytes bound one batch statement. A
	// write larger than maxWriteBatchBytes goes in a batch of its own.
	maxWriteBatch      = 128
	maxWriteBatchBytes = 1 << 20
)

// write runs w's fast path: on q with single when a statement place is
// free, else in a batch. It returns what single returns: the floor (the
// token) and found when the part was stored, found false when the caller
// must run the full check.
func (b *writeBatcher) write(ctx context.Context, r *Resource, q dbx.Querier, w leasecore.Write, single statement) (int64, bool, error) {
	b.mu.Lock()
	if b.running < maxWritesInFlight {
		b.running++
		b.mu.Unlock()
		defer b.next(r)
		return single(q)
	}
	qw := &queuedWrite{w: w, ctx: ctx, done: make(chan batchAnswer, 1)}
	b.queue = append(b.queue, qw)
	b.mu.Unlock()
	select {
	case a := <-qw.done:
		switch {
		case a.alone:
			return single(q)
		case a.stored:
			return int64(w.Token), true, nil
		}
		return 0, false, nil
	case <-ctx.Done():
		// A batch may still store the part: an answer lost, as when a
		// single statement's ctx ends.
		return 0, false, ctx.Err()
	}
}

// next is called when a fast-path statement ends: its place goes to a
// batch of the queued writes, run in a goroutine, or is freed.
func (b *writeBatcher) next(r *Resource) {
	if batch := b.take(); batch != nil {
		go b.drain(r, batch)
	}
}

// drain runs batches until the queue is empty, then frees its place.
func (b *writeBatcher) drain(r *Resource, batch []*queuedWrite) {
	for batch != nil {
		b.run(r, batch)
		batch = b.take()
	}
}

// take removes the next batch from the queue, keeping the caller's place;
// with nothing queued it frees the place and returns nil. A batch holds at
// most one write per scope and part (an upsert cannot change one row twice
// in a statement): a second write of a part stays queued, in its order,
// for the next batch. Writes whose callers left are dropped.
func (b *writeBatcher) take() []*queuedWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	var (
		batch []*queuedWrite
		rest  = b.queue[:0]
		seen  = map[partKey]bool{}
		bytes int
	)
	for _, qw := range b.queue {
		k := partKey{qw.w.Scope, qw.w.Part}
		switch {
		case qw.ctx.Err() != nil:
			// gone: write returned ctx's error already
		case seen[k] || len(batch) == maxWriteBatch ||
			(len(batch) > 0 && bytes+len(qw.w.Content) > maxWriteBatchBytes):
			rest = append(rest, qw)
		default:
			seen[k] = true
			bytes += len(qw.w.Content)
			batch = append(batch, qw)
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	if len(batch) == 0 {
		b.running--
		return nil
	}
	return batch
}

// run sends one FencedWriteManyShared for the callers of batch still
// waiting and answers each of them.
func (b *writeBatcher) run(r *Resource, batch []*queuedWrite) {
	type jsonWrite struct {
		Scope   string `json:"scope"`
		Part    string `json:"part"`
		Content string `json:"content"`
		Writer  string `json:"writer"`
		Token   int64  `json:"token"`
	}
	in := make([]jsonWrite, 0, len(batch))
	waiting := batch[:0:0]
	for _, qw := range batch {
		if qw.ctx.Err() != nil {
			continue
		}
		in = append(in, jsonWrite{qw.w.Scope, qw.w.Part, qw.w.Content, qw.w.Writer, int64(qw.w.Token)})
		waiting = append(waiting, qw)
	}
	if len(waiting) == 0 {
		return
	}
	arg, err := json.Marshal(in)
	if err != nil {
		for _, qw := range waiting {
			qw.done <- batchAnswer{alone: true}
		}
		return
	}

	ctxs := make([]context.Context, len(waiting))
	for i, qw := range waiting {
		ctxs[i] = qw.ctx
	}
	stored, err := queryShared(r.fence.db, ctxs, r.fence.stmt.writeManyShared, arg, func(rows dbx.Rows) (k partKey, err error) {
		err = rows.Scan(&k.scope, &k.part)
		return k, err
	})
	for _, qw := range waiting {
		if err != nil {
			// Nothing was stored (one statement), or the commit's answer
			// was lost; either way the caller's own statement stores the
			// same part with the same content and token again, which is
			// what it would have done.
			qw.done <- batchAnswer{alone: true}
			continue
		}
		qw.done <- batchAnswer{stored: stored[partKey{qw.w.Scope, qw.w.Part}]}
	}
}
