package fencepg

import (
	"log/slog"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// WithFenceObserver adds a function called with the outcome of every
// fenced write of a Fence, FenceDB or Resource (NewFence, NewFenceDB,
// NewResource, NewResourceDB; the lease stores and outboxes ignore it):
// one leasecore.FenceEvent per call of RunTx, Commit, SendBatch, Advance,
// Write and WriteBatch that returns a Result, accepted or rejected (see
// leasecore.FenceEvent). Each call of the option adds one; they run in the
// order given. A nil f is ignored.
//
// Observers run synchronously on the caller's goroutine, after the
// outcome is known: for RunTx and Commit after the commit (or the rollback
// of a rejection). They must not block. Without one, the accepted path
// does nothing more than test that none is set.
func WithFenceObserver(f func(leasecore.FenceEvent)) Option {
	return func(c *config) {
		if f != nil {
			prev := c.observe
			if prev == nil {
				c.observe = f
				return
			}
			c.observe = func(ev leasecore.FenceEvent) { prev(ev); f(ev) }
		}
	}
}

// WithLogger logs the fence's outcomes to l (backendkit.FenceLogger): a
// stale write rejected at WARN with its token and the floor that beat it,
// a token from another lease service at ERROR, an accepted write at DEBUG
// only. It is a fence observer like those of WithFenceObserver, and adds
// to them. A nil l is ignored. Sessions log with leasecore.WithLogger.
func WithLogger(l *slog.Logger) Option {
	return WithFenceObserver(backendkit.FenceLogger(l))
}

// report tells the fence's observers, if any, how the write op of claim c
// ended. Rejection paths call it as is; the accepted paths test
// f.cfg.observe first, so that without an observer they build nothing.
func (f *fenceCore) report(op string, c leasecore.Claim, res leasecore.Result, err error) {
	if f.cfg.observe != nil {
		f.cfg.observe(leasecore.FenceEvent{Op: op, Claim: c, Result: res, Err: err})
	}
}
