// Package backendkit is the kit for writing a leasecore backend: the
// validators every Lease and FencedResource method runs before it sends or
// writes anything, the limits they enforce, the optional interfaces a
// backend may implement (and that leasecore's Session, SessionSet, Campaign
// and Observe discover on a Lease), the diagnosis of a rejection by a floor
// from another token space, and a logger for fence observers.
//
// Applications do not need it: they use leasecore and a backend. A backend
// calls the validators first in each method and returns their error as is:
// each is an *leasecore.ArgError wrapping leasecore.ErrInvalidArgument that
// names the operation and the field, or, for a context that is already
// done, an error wrapping the context's. The conformance suite checks that
// a backend does.
package backendkit
