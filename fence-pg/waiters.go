package fencepg

import (
	"context"
	"sync/atomic"
)

// whileAnyWaits returns a context for a statement sent on behalf of several
// callers (a batch of renewals or of writes): it is cancelled once every
// one of ctxs has ended, i.e. once no caller waits for the answer any
// more, or when release is called. Call release when the statement is
// done.
func whileAnyWaits(ctxs []context.Context) (ctx context.Context, release func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(ctxs)))
	stops := make([]func() bool, 0, len(ctxs))
	for _, c := range ctxs {
		stops = append(stops, context.AfterFunc(c, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
