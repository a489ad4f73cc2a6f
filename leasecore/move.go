package leasecore

import "fmt"

// ScopeSeal is what moving a scope to another server carries from its old
// location to its new one: the scope's floor as it was when the old
// location sealed the scope, and that floor's token space.
//
// A scope's floor must live with the data it protects: a fence decides from
// its own floor only. Moving a scope's data to another PostgreSQL database
// or etcd cluster therefore moves its floor in the same steps, and fences
// the old location:
//
//  1. Seal, at the old location, in the atomic operation that reads the
//     scope's data there (fencepg.Fence.Seal in the transaction that
//     selects the rows, fenceetcd.Fence.Seal with the reads in its Txn): the
//     floor becomes SealedFloor, so every later write there is rejected,
//     and the floor it had, its space and the destination To are recorded
//     there. It returns this ScopeSeal.
//  2. Install, at the new location, in the atomic operation that writes the
//     data there (fencepg.Fence.Install, fenceetcd.Fence.Install): the
//     floor becomes Floor, with Space, unless it is larger already. A
//     holder whose token is below Floor — paused across the move, its
//     lease long taken over — is rejected at the new location as it was
//     at the old.
//  3. Switch the routing to the new location.
//
// No step needs the other server: each location checks its own floor only.
// A crash between the steps leaves the scope sealed at the old location
// and not yet installed at the new one, where no holder is routed yet:
// every write is rejected, which is safe; run the move again (both steps
// are idempotent: sealing a sealed scope returns the ScopeSeal of the first
// seal).
type ScopeSeal struct {
	Scope string
	// To names the new location, as the caller labelled it ("db2",
	// "etcd-eu"): the old location records it and reports it in every
	// *ScopeMovedError, for holders that still write there.
	To string
	// Floor is the scope's floor at the old location when it was sealed,
	// the largest token accepted there; 0 when the scope never accepted a
	// check there. Never SealedFloor.
	Floor Token
	// Space is the token space of Floor as the old location stored it
	// (Claim.Space of the claim that raised it); empty when unknown.
	Space string
}

// ScopeMovedError is a fence's rejection of a claim by a sealed scope: the
// scope moved to To, and this location rejects every write (its floor is
// SealedFloor). The fence's Result says rejected as for any stale token;
// this error, returned with it, says where the scope went. It wraps
// ErrScopeMoved.
type ScopeMovedError struct {
	Op    string // "check", "run tx", "write", "seal", ...
	Scope string
	Token Token  // the claim's token; 0 for a seal refused for another destination
	To    string // the destination the seal recorded
	// Floor is the scope's floor when it was sealed here, which moved
	// with the data: a token below it is stale at the new location too.
	Floor Token
}

func (e *ScopeMovedError) Error() string {
	if e.Token == 0 {
		return fmt.Sprintf("%s: %s scope %q: the scope was sealed here and moved to %q (its floor was %d at the seal)",
			ErrScopeMoved, e.Op, e.Scope, e.To, e.Floor)
	}
	return fmt.Sprintf("%s: %s scope %q: token %d rejected: the scope was sealed here and moved to %q (its floor was %d at the seal): "+
		"write there, where a token below %d is rejected too", ErrScopeMoved, e.Op, e.Scope, e.Token, e.To, e.Floor, e.Floor)
}

// Unwrap returns ErrScopeMoved.
func (e *ScopeMovedError) Unwrap() error { return ErrScopeMoved }
