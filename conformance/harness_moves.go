package conformance

import "context"

// MoveMode says how ScopeMoves.MoveScope moves a scope.
type MoveMode string

// The modes of ScopeMoves.MoveScope.
const (
	// MoveWithFloor is the backend's move: the scope sealed at the old
	// location in the atomic operation that reads its data, installed at
	// the new location in the atomic operation that writes it there
	// (leasecore.ScopeSeal): the floor moves with the data, and the old
	// location rejects every write from then on.
	MoveWithFloor MoveMode = "with floor"
	// MoveDataOnly is the negative control, the naive move: the data
	// copied as it is, no seal at the old location, no floor at the new
	// one.
	MoveDataOnly MoveMode = "data only"
)

// ScopeMoves is an optional interface that may be implemented by a Harness
// whose backend can move a scope — its data and its floor — to another
// server of the same kind (F17): another PostgreSQL database, another etcd
// cluster. A scope's floor must live with the data it protects, since a
// fence decides from its own floor only; the case shows a holder paused
// across the move rejected at the new location, and the naive move that
// copies the data without the floor letting it in.
type ScopeMoves interface {
	// MoveTarget returns a client of a second location of the harness's
	// resource — a database or cluster other than OpenResource's, with
	// the same storage (the part store), options and attempt log, and
	// empty when the harness was created — and the label the backend's
	// seal records for it: the destination a *leasecore.ScopeMovedError
	// names. Every call returns a client of the same location. The
	// Harness closes the clients, and stops a server it started for the
	// location, in Close.
	MoveTarget(ctx context.Context) (res Resource, label string, err error)

	// MoveScope moves scope's parts — what OpenResource's Write stored for
	// the scope — from OpenResource's location to MoveTarget's, as mode
	// says. With MoveWithFloor, through the backend's public seal and
	// install (the calls a user's mover makes): an install the backend
	// rejects (a newer token was accepted at the new location) writes
	// nothing there and returns an error. With MoveDataOnly, the parts are
	// copied and nothing else is done. Either way the parts keep their
	// content, writer and token, and the old location keeps its copy.
	MoveScope(ctx context.Context, scope string, mode MoveMode) error
}
