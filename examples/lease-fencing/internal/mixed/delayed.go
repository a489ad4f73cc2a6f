package mixed

import (
	"context"

	"github.com/leasefence/leasefence/conformance"
)

var _ conformance.DelayedNetwork = (*harness)(nil)

// ResourceAddress implements conformance.DelayedNetwork on the resource
// side, the only side with a resource: PostgreSQL's address (or its
// pooler's), from the PostgreSQL harness.
func (h *harness) ResourceAddress() string {
	return h.pg.(conformance.DelayedNetwork).ResourceAddress()
}

// ResourcesVia implements conformance.DelayedNetwork with the PostgreSQL
// harness's clients through addr; the leases stay on etcd, unproxied.
func (h *harness) ResourcesVia(ctx context.Context, addr string) (fenced, unfenced conformance.Resource, err error) {
	return h.pg.(conformance.DelayedNetwork).ResourcesVia(ctx, addr)
}
