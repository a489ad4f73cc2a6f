package mixed

import (
	"context"

	"github.com/leasefence/leasefence/conformance"
)

var _ conformance.ScopeMoves = (*harness)(nil)

// MoveTarget implements conformance.ScopeMoves on the resource side, the
// only side with a resource: the PostgreSQL harness's second resource
// database. The tokens stay etcd's: the seal carries the floor and its
// token space whatever lease service issued them.
func (h *harness) MoveTarget(ctx context.Context) (conformance.Resource, string, error) {
	return h.pg.(conformance.ScopeMoves).MoveTarget(ctx)
}

// MoveScope implements conformance.ScopeMoves with the PostgreSQL
// harness's mover.
func (h *harness) MoveScope(ctx context.Context, scope string, mode conformance.MoveMode) error {
	return h.pg.(conformance.ScopeMoves).MoveScope(ctx, scope, mode)
}
