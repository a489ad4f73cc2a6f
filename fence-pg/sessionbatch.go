package fencepg

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
)

// renewBatcher gathers the fast renewals (RenewSessionsGeneration) that
// concurrent RenewAll calls on one store want into one statement and one
// durable commit: while a statement runs, the renewals that arrive queue,
// and the next statement carries all of them (up to maxRenewBatch). A
// process keeping thousands of holders alive through one store renews them
// with far fewer commits than holders, and a single renewal waits for at
// most the statement already running.
//
// The statements run in a goroutine that exists only while renewals are
// queued or running: it starts with the first renewal of an idle store and
// returns when the queue is empty, so an idle store, which has no Close,
// leaves nothing running. Each caller waits for its own answer or its own
// ctx, whichever comes first; a statement is cancelled once every caller
// it carries has stopped waiting.
type renewBatcher struct {
	mu      sync.Mutex
	queue   []*fastRenewal
	running bool // the goroutine runs
}

// fastRenewal is one RenewAll's fast renewal: the session row the store
// knows (verifiedSessions) to carry every name of the call.
type fastRenewal struct {
	holder     string
	ttlUs      int64
	sessionID  string
	generation int64

	ctx  context.Context
	done chan fastResult // buffered: an answer never waits for a caller that left
}

type fastResult struct {
	extended bool // the session row still matched and was extended
	err      error
}

// maxRenewBatch bounds the renewals of one statement.
const maxRenewBatch = 256

// renew queues r and waits for its statement's answer or ctx.
func (b *renewBatcher) renew(ctx context.Context, s *LeaseStore, r fastRenewal) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	r.ctx, r.done = ctx, make(chan fastResult, 1)
	b.mu.Lock()
	b.queue = append(b.queue, &r)
	if !b.running {
		b.running = true
		go b.drain(s)
	}
	b.mu.Unlock()
	select {
	case res := <-r.done:
		return res.extended, res.err
	case <-ctx.Done():
		// The statement may still extend the session: a renewal whose
		// answer is lost, as when a direct statement's ctx ends.
		return false, ctx.Err()
	}
}

// drain runs statements until the queue is empty.
func (b *renewBatcher) drain(s *LeaseStore) {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.queue, b.running = nil, false
			b.mu.Unlock()
			return
		}
		n := min(len(b.queue), maxRenewBatch)
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.run(s, batch)
	}
}

// run sends one statement for the callers of batch still waiting and
// answers each of them.
func (b *renewBatcher) run(s *LeaseStore, batch []*fastRenewal) {
	type jsonRenewal struct {
		Holder     string `json:"holder"`
		TTLus      int64  `json:"ttl_us"`
		SessionID  string `json:"session_id"`
		Generation int64  `json:"generation"`
	}
	type key struct {
		holder     string
		ttlUs      int64
		sessionID  string
		generation int64
	}
	var (
		in      []jsonRenewal
		waiting []*fastRenewal
	)
	for _, r := range batch {
		if r.ctx.Err() != nil {
			continue // gone; renew returned ctx's error already
		}
		in = append(in, jsonRenewal{r.holder, r.ttlUs, r.sessionID, r.generation})
		waiting = append(waiting, r)
	}
	if len(waiting) == 0 {
		return
	}
	arg, err := json.Marshal(in)
	if err != nil {
		for _, r := range waiting {
			r.done <- fastResult{err: err}
		}
		return
	}

	ctxs := make([]context.Context, len(waiting))
	for i, r := range waiting {
		ctxs[i] = r.ctx
	}
	extended, err := queryShared(s.db, ctxs, s.sess.renewGeneration, arg, func(rows dbx.Rows) (k key, err error) {
		err = rows.Scan(&k.holder, &k.ttlUs, &k.sessionID, &k.generation)
		return k, err
	})
	for _, r := range waiting {
		if err != nil {
			r.done <- fastResult{err: err}
			continue
		}
		r.done <- fastResult{extended: extended[key{r.holder, r.ttlUs, r.sessionID, r.generation}]}
	}
}
