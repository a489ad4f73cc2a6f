package leasecore

import (
	"context"
	"math"
	"strconv"
	"time"
)

// Token is a fencing token. Zero is never a valid token; a backend issues
// tokens from 1 upwards and never reuses one (I2).
type Token uint64

// SealedFloor is the floor of a scope sealed at a location it moved away
// from (see ScopeSeal): the largest value a floor can hold, above every
// token. A fence compares every claim with the floor as it always does, so
// a sealed scope rejects every write there without a condition of its own
// on the accepted path; only the rejection path asks why, and reports a
// *ScopeMovedError. Result.Floor and the backends' Floor read it as is.
const SealedFloor Token = math.MaxInt64

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// Grant is the result of a successful Acquire or Renew: one continuous
// holding period of a lease, identified by its token.
type Grant struct {
	Name   string
	Holder string
	Token  Token
	TTL    time.Duration

	// Space names the token space Token belongs to: the lease service that
	// issued it, as that service identifies itself (fencepg:
	// "postgres:<uuid of the lease schema>"; fenceetcd: "etcd:<cluster id
	// in hex>"). Empty: the backend does not say. Tokens are comparable
	// only within one space (see ErrTokenSpace); a fence stores the space
	// of the token that raised a scope's floor, so that a rejection by a
	// floor from another space can say so. Renew keeps it.
	Space string

	// Start is the local time, with its monotonic reading, taken just
	// before the request that acquired or last renewed the lease was sent
	// (or earlier: a backend whose holding period began before the call,
	// such as fenceetcd with shared leases, dates the grant back to it).
	// The server computes the expiry only after it received the request, so
	// Start+TTL is never later than the server's expiry as long as the two
	// clocks run at the same rate (Chubby §2.8). Reading the clock after
	// the response instead would count the request's transit time twice in
	// the holder's favour.
	Start time.Time
}

// LocalDeadline returns the time after which the holder must not start new
// work under this grant: Start + TTL - margin. Compare it only with
// time.Now() of the same process (both carry monotonic readings); never
// compare it with a server's wall-clock expiry.
func (g Grant) LocalDeadline(margin time.Duration) time.Time {
	return g.Start.Add(g.TTL - margin)
}

// Lease is a lease service: named leases, each with at most one unexpired
// holder, that issue a new fencing token on every acquire.
//
// Implementations must keep I1 and I2 (see the package doc). Expiry is
// decided by the backend's clock only. All methods validate their input
// first (backendkit.CheckAcquire, backendkit.CheckGrant) and, on bad input
// or a context that is already done, return an error and change nothing.
type Lease interface {
	// Acquire takes the lease name for holder for ttl. It succeeds when the
	// lease is free, expired or released, and then returns a token strictly
	// larger than every token issued for name before. While another
	// holding period is unexpired (whoever holds it, the same holder
	// included) it returns an error wrapping ErrHeld and changes nothing.
	Acquire(ctx context.Context, name, holder string, ttl time.Duration) (Grant, error)

	// Renew extends the holding period of g by g.TTL, measured by the
	// backend's clock from the moment it executes the renewal. It succeeds
	// only when name, holder and token match and the lease has not expired;
	// otherwise it returns an error wrapping ErrLost and changes nothing.
	// A renew after expiry always fails, even if nobody took over: the
	// holder must acquire again and gets a new token. The token never
	// changes on renew.
	Renew(ctx context.Context, g Grant) (Grant, error)

	// Release ends the holding period of g at once, so the next Acquire
	// need not wait for the TTL. The token is never reused. It fails with
	// an error wrapping ErrLost, changing nothing, when g is not the
	// current unexpired holding period (released twice, expired, or taken
	// over).
	Release(ctx context.Context, g Grant) error
}

// LeaseState is a lease as the backend sees it at the moment of the read.
type LeaseState struct {
	Name   string
	Exists bool // false: the lease was never acquired (and is free)
	// Holder is the holder given to the Acquire of the latest holding
	// period, as the backend stores it; it must be set whenever Held is.
	Holder string
	Token  Token // the latest token issued for the lease
	// Held reports whether the latest holding period is unexpired by the
	// backend's clock at the moment of the read.
	Held bool
	// Released reports that the latest holder released the lease.
	Released bool
	// Remaining is how long the latest holding period still runs by the
	// backend's clock; zero when it is not held.
	Remaining time.Duration
}

// LeaseInspector is an optional interface that may be implemented by a
// Lease. It reads a lease's state without changing it, for audits,
// dashboards and the conformance suite. Nothing should base a decision to
// write on it: the answer is stale when it arrives.
//
// Inspect reports what the backend holds, not what the client remembers:
// any client of the same lease service, not only the one that acquired,
// sees a held lease with its Holder and Token (the conformance suite, which
// requires a LeaseInspector, compares both after every call, read through
// another client than the one that made it). A backend built on a lock
// whose stored state does not name the holder must store it for Inspect.
type LeaseInspector interface {
	Inspect(ctx context.Context, name string) (LeaseState, error)
}

// Write is one fenced write: content for one part of a scope, carrying the
// writer's token.
type Write struct {
	Scope   string // what one lease protects, e.g. "daily-report"
	Part    string // one row or object within the scope, e.g. "summary"
	Content string
	Writer  string // the holder, for the audit log
	Token   Token
	Space   string // the token's space (Grant.Space); optional, see Claim.Space
}

// Result is the outcome of a fenced write. A rejection is a result, not an
// error: errors are for bad input and broken backends. The one exception is
// a rejection by a floor from another token space (a broken deployment, see
// ErrTokenSpace): the Result still says rejected, and the error, a
// *TokenSpaceError, says why.
type Result struct {
	Accepted bool
	// Floor is the scope's floor after the attempt: the largest token the
	// resource has accepted for the scope. On acceptance it equals the
	// write's token; on rejection it is the larger token that caused it.
	Floor Token
}

// FencedResource is a protected resource that checks fencing tokens.
//
// Write must keep I3: it compares w.Token with the largest token accepted
// for w.Scope (the floor) in the same atomic operation as the data write,
// accepts when w.Token >= floor (an equal token is the same holding period
// writing again), advances the floor, and stores the content; otherwise it
// rejects and stores nothing. The floor is kept per scope, not per part, so
// a stale holder cannot write a part the newer holder has not touched yet.
// A resource never consults the lease service: it decides from its own
// persisted floor only (Chubby §2.4).
type FencedResource interface {
	Write(ctx context.Context, w Write) (Result, error)
}

// StoredPart is the current content of one part.
type StoredPart struct {
	Scope, Part, Content, Writer string
	Token                        Token
	WrittenAt                    time.Time
}

// ScopeFloor is one scope's floor: the largest token its fence accepted
// (what the backends' Fence.Floors list).
type ScopeFloor struct {
	Scope string
	Floor Token
}

// Attempt is one entry of a resource's write log: every attempt, accepted
// or rejected.
type Attempt struct {
	Scope, Part, Writer string
	Token               Token
	Accepted            bool
	Floor               Token // the scope's floor after the attempt
	At                  time.Time
}
