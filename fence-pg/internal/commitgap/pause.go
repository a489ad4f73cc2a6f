package commitgap

import "context"

type pauseKey struct{}

// WithPause returns ctx carrying pause, which FenceDB's RunTx and Commit
// run with it between the comparison and the COMMIT: database/sql sends
// them as two round trips, and a holder frozen between the two leaves its
// transaction idle there, with the floor row share-locked. A test pauses
// there to show what the holder then gets. Fence (pgx) sends both in one
// round trip and ignores it.
func WithPause(ctx context.Context, pause func()) context.Context {
	return context.WithValue(ctx, pauseKey{}, pause)
}

// PauseFrom returns the pause ctx carries, or nil.
func PauseFrom(ctx context.Context) func() {
	p, _ := ctx.Value(pauseKey{}).(func())
	return p
}
