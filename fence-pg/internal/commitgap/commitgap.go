// Package commitgap is the commit-gap test hook of fencepg.Resource (and,
// in pause.go, of FenceDB), kept out of fencepg's API: only this module
// (its tests, pgconformance) can import it.
//
// With a gap, Resource.Write and WriteBatch run BEGIN; the fence
// statement; gap(ctx, w); COMMIT, so the write holds the scope's floor row
// lock while gap runs and a test can show a second writer of the scope
// waiting for it (conformance case F6b). If gap returns an error, the write is rolled
// back and returns that error (wrapped). Without one, the fence statement
// runs alone in autocommit. A Fence ignores it.
package commitgap

import (
	"context"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Gap runs inside a write, after the fence statement and before COMMIT.
type Gap func(ctx context.Context, w leasecore.Write) error

type key struct{}

// With returns ctx carrying gap for the writes made with it.
func With(ctx context.Context, gap Gap) context.Context {
	return context.WithValue(ctx, key{}, gap)
}

// From returns the gap ctx carries, or nil.
func From(ctx context.Context) Gap {
	g, _ := ctx.Value(key{}).(Gap)
	return g
}

// Target is what Wrap wraps: a fencepg.Resource.
type Target interface {
	leasecore.FencedResource
	backendkit.BatchWriter
	backendkit.ResourceReader
}

// Resource is a Target whose every write runs with Gap.
type Resource struct {
	Target
	Gap Gap
}

// Wrap returns r with every write running gap.
func Wrap(r Target, gap Gap) Resource { return Resource{Target: r, Gap: gap} }

// Write writes with the gap.
func (r Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	return r.Target.Write(With(ctx, r.Gap), w)
}

// WriteBatch writes with the gap.
func (r Resource) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	return r.Target.WriteBatch(With(ctx, r.Gap), b)
}
