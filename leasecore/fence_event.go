package leasecore

// FenceEvent reports the outcome of one fenced write — one check of a
// claim against its scope's floor — to a fence observer (fencepg's and
// fenceetcd's WithFenceObserver; their WithLogger options log them).
//
// A fence reports every call that returns a Result: accepted (Result.Floor
// is the claim's token) or rejected (Result.Floor is the larger floor that
// beat it). Calls that end in an error without a Result (bad input, an
// unreachable server, an error of the caller's own function) are not
// reported; the caller has the error. One call is one event, also when the
// fence advanced the floor on the way (a first Commit or SendBatch of a
// holding period).
type FenceEvent struct {
	// Op is the fence operation as its errors name it: "check", "run tx",
	// "send batch", "advance", "write", "write batch", "commit".
	Op     string
	Claim  Claim // scope, writer, token and token space
	Result Result
	// Err is the error returned with a rejection, if any: a
	// *TokenSpaceError when the floor was set by a token from another
	// token space (errors.Is(Err, ErrTokenSpace): a misconfiguration, not
	// a stale holder), a *ScopeMovedError when the scope was moved to
	// another location (errors.Is(Err, ErrScopeMoved): see ScopeSeal), or
	// the failure to log the rejection. Nil for an acceptance.
	Err error
}
