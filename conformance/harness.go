package conformance

import (
	"context"
	"os/exec"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// NewHarness returns a Harness whose lease service and resource start
// empty. The suite calls it once per case.
type NewHarness func(ctx context.Context) (Harness, error)

// Harness gives the suite access to one backend (or one pairing of a lease
// backend with a resource backend). It stays small on purpose: abilities
// only some backends have are optional interfaces, found by type assertion
// (LongTransactions, CommitGapResources, LockWaitProbe, NegativeControls,
// HolderProcesses, CrashRestarter, UserDataResources, AmbiguousOutcomes,
// OutboxResources, DelayedNetwork, Replicas, ScopeMoves). A
// backend that deliberately lacks one declares it in Traits.Absent; a case
// that needs an ability the harness neither implements nor declares absent
// fails, so nothing passes by being forgotten. (An ability listed in
// graceAbilities, run.go — none today — makes such a case skip instead,
// saying so, while the repository's own harnesses catch up with it.)
type Harness interface {
	// Traits describes the backend.
	Traits() Traits

	// OpenLease returns a new client of the lease service with its own
	// connection (the suite opens 16 of them for the concurrent-acquire
	// case). All clients of one Harness see the same leases. The client
	// must also implement leasecore.LeaseInspector. The Harness closes it
	// in Close.
	OpenLease(ctx context.Context) (leasecore.Lease, error)

	// OpenResource returns a new client of the fenced resource. All
	// clients of one Harness see the same state. The Harness closes it in
	// Close.
	OpenResource(ctx context.Context) (Resource, error)

	// Close releases everything the Harness opened.
	Close() error
}

// Resource is a fenced resource the suite can also read back.
type Resource interface {
	leasecore.FencedResource
	backendkit.ResourceReader
}

// Traits describes what a backend is and does.
type Traits struct {
	// Name identifies the configuration in output, e.g. "postgres/pgx".
	Name string
	// MinTTL is the shortest TTL the lease service honours. The suite
	// scales its timings from it.
	MinTTL time.Duration
	// TTLGranularity, when not zero, is the unit every TTL must be a
	// multiple of (etcd leases: whole seconds). The suite rounds its TTLs
	// up to it and scales the related timings by the same factor.
	TTLGranularity time.Duration
	// TokenStep is 1 when every acquire issues exactly the previous
	// token + 1 (PostgreSQL); 0 when tokens only increase strictly (etcd
	// revisions). The suite then checks "strictly greater" instead of "+1".
	TokenStep leasecore.Token
	// Absent lists abilities the backend deliberately lacks, with the
	// reason printed when a case skips because of it.
	Absent map[Ability]string
	// AttemptLog is the mode the harness's resources (OpenResource,
	// UserDataResource) keep their attempt log in, and so what the suite
	// expects Attempts to return: every check with leasecore.LogAll, the
	// rejected ones with leasecore.LogRejected (the zero value, the
	// backends' default), none with leasecore.LogNone. A harness whose
	// resources log more or less than it declares fails X1 or F4.
	AttemptLog leasecore.AttemptLog
}

// Ability names an optional ability a case may need.
type Ability string

// The optional abilities.
const (
	AbilityLongTransaction  Ability = "long transaction"  // LongTransactions (F2)
	AbilityCommitGap        Ability = "commit gap"        // CommitGapResources (F6b)
	AbilityLockWaitProbe    Ability = "lock-wait probe"   // LockWaitProbe (F6b)
	AbilityNegativeControls Ability = "negative controls" // NegativeControls (F5, F6a, F7, F9)
	AbilityHolderProcesses  Ability = "holder processes"  // HolderProcesses (F4, F5, F4u, F4m, F12)
	AbilityCrashRestart     Ability = "crash and restart" // CrashRestarter (F8)
	AbilityUserData         Ability = "user data"         // UserDataResources (F1u, F4u, F4m, F6u, F7u, F10u, X1)
	// AbilityAmbiguousOutcomes is AmbiguousOutcomes (X2's retried release
	// and lost acquire answer).
	AbilityAmbiguousOutcomes Ability = "ambiguous outcomes"
	// AbilityOutbox is OutboxResources (F9b; its relay section also needs
	// HolderProcesses).
	AbilityOutbox Ability = "fenced outbox"
	// AbilityDelayedNetwork is DelayedNetwork (F14).
	AbilityDelayedNetwork Ability = "delayed network"
	// AbilityReplicas is Replicas (F16).
	AbilityReplicas Ability = "replicas"
	// AbilityScopeMoves is ScopeMoves (F17).
	AbilityScopeMoves Ability = "scope moves"
	// AbilityCheckFirst is CheckFirstControl (F18's negative control).
	AbilityCheckFirst Ability = "check first"
)

// LongTransactions is an optional interface that may be implemented by a
// Harness whose lease store is transactional (F2). Without it, and with the
// ability declared absent, F2's long-transaction checks skip.
type LongTransactions interface {
	// BeginLongTransaction opens a transaction on a connection of its own
	// and keeps it open until Rollback.
	BeginLongTransaction(ctx context.Context) (LongTransaction, error)
}

// LongTransaction is an open transaction on the lease store.
type LongTransaction interface {
	// Now returns the transaction's clock (PostgreSQL now()).
	Now(ctx context.Context) (time.Time, error)
	// ClockNow returns the current time (PostgreSQL clock_timestamp()).
	ClockNow(ctx context.Context) (time.Time, error)
	// Acquire runs the lease service's acquire statement inside this
	// transaction, which a real lease store must never do.
	Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error)
	// Rollback ends the transaction and frees its connection.
	Rollback(ctx context.Context) error
}

// AmbiguousOutcomes is an optional interface that may be implemented by a
// Harness (X2's "retried release" and "lost acquire answer"). It makes the
// outcome of one lease operation ambiguous, the way a connection lost
// after the request was sent does: the server carried the operation out,
// the caller got an error and cannot tell whether it took effect. What the
// suite then checks is what a retry, or the holder's other renewals, do
// with the state the lost operation left: a retried release must not end
// the next holder's hold, and an acquire nobody was told about must not
// leave a holder that outlives its TTL.
type AmbiguousOutcomes interface {
	// AmbiguousLease returns a new client of the lease service, like
	// OpenLease (its own connection, the same leases, closed by the
	// Harness's Close), and loseNextAnswer.
	//
	// Until loseNextAnswer is called the client works normally. After it
	// is called, the client's next Acquire or Release (the calls X2 makes
	// ambiguous; a harness may treat Renew the same way) is sent and
	// carried out by the server in full — for an operation of several
	// requests, through the request that takes effect: the transaction
	// that creates or deletes the lease, not a preparatory one — and its
	// answer is lost on the way back: the call returns an error, which
	// should wrap leasecore.ErrUnavailable as a lost connection's does
	// (the suite retries only those). It must not return nil or the
	// grant. Only that one call is affected; later calls on the same
	// client must work again, if need be after the client reconnects on
	// its own (the suite retries a call that fails with ErrUnavailable
	// for up to 30 seconds). loseNextAnswer is called from the case's
	// goroutine, never during a call on the client.
	//
	// A TCP proxy between this client and the server does it for any
	// backend: once armed, it forwards the next request, waits for the
	// server's complete answer to it, drops that answer and closes the
	// client's connection; new connections are forwarded again. Warm the
	// client up first (acquire, renew and release a name of the harness's
	// own) if its first use of a statement takes an extra round trip, so
	// that the answer dropped is that of the request that took effect. A
	// client with interceptors (gRPC) can instead make the real call and
	// then return an error in place of its answer.
	AmbiguousLease(ctx context.Context) (lease leasecore.Lease, loseNextAnswer func(), err error)
}

// Gap is a test hook a resource calls inside a write. It returns when the
// test lets the write go on; an error abandons the write.
type Gap func(ctx context.Context, w leasecore.Write) error

// CommitGapResources is an optional interface that may be implemented by a
// Harness whose fenced write is a transaction (F6b).
type CommitGapResources interface {
	// FencedResourceWithGap returns a client of the same fenced resource
	// that calls gap inside each write, after the floor has been compared
	// and advanced and before the write commits, so that the write holds
	// whatever it locks while gap runs.
	FencedResourceWithGap(ctx context.Context, gap Gap) (Resource, error)
}

// LockWaitProbe is an optional interface that may be implemented by a
// Harness (F6b). It lets the suite observe, rather than assume after a
// sleep, that a write is blocked behind another.
type LockWaitProbe interface {
	// LockWaits describes the resource's writes currently waiting for a
	// lock, e.g. "wait_event_type=Lock wait_event=transactionid"; empty
	// when none waits.
	LockWaits(ctx context.Context) ([]string, error)
}

// NegativeControls is an optional interface that may be implemented by a
// Harness. Its resources are counterexamples: designs that look plausible
// and fail. The suite shows each failing on the backend itself, next to the
// fenced resource passing the same timeline. Each resource shares the
// fenced resource's storage; its Floor reads the same floor.
type NegativeControls interface {
	// UnfencedResource ignores tokens: a plain upsert (F5).
	UnfencedResource(ctx context.Context) (Resource, error)
	// CheckThenWriteResource reads the floor, decides, then writes the
	// floor and the data as separate steps; gap runs after the decision
	// and before the writes (F6a).
	CheckThenWriteResource(ctx context.Context, gap Gap) (Resource, error)
	// RowFencedResource compares the token with the stored part's token
	// only, with no scope floor (F7).
	RowFencedResource(ctx context.Context) (Resource, error)
	// IdempotentPublisher stands in for an external side effect that only
	// deduplicates by business key (Scope, Part): the first write of a key
	// is accepted, every later one dropped, tokens ignored (F9).
	IdempotentPublisher(ctx context.Context) (Resource, error)
}

// ResourceKind selects the resource a holder process writes to.
type ResourceKind string

// Resource kinds for holder processes.
const (
	KindFenced   ResourceKind = "fenced"   // OpenResource's part store
	KindUnfenced ResourceKind = "unfenced" // NegativeControls.UnfencedResource
	// KindUserData is UserDataResources.UserDataResource with no gap.
	KindUserData ResourceKind = "user data"
	// KindMarkerFirst is UserDataResources.MarkerFirstResource; the
	// holder's PREPARE writes its marker.
	KindMarkerFirst ResourceKind = "marker first"
	// KindOutbox is OutboxResources.FencedOutbox; the holder's RELAY runs
	// its relay (F9b kills such a relay process with SIGKILL).
	KindOutbox ResourceKind = "outbox"
	// KindCheckFirst is CheckFirstControl.CheckFirstResource (F18's
	// negative control).
	KindCheckFirst ResourceKind = "check first"
)

// CheckFirstControl is an optional interface that may be implemented by a
// Harness whose fenced write is a transaction (F18's negative control).
// Without it, and with AbilityCheckFirst declared absent (a backend whose
// fenced operation is one request has no first statement to hold), the
// control skips. A harness with it and HolderProcesses must accept
// KindCheckFirst.
type CheckFirstControl interface {
	// CheckFirstResource returns the suite's user tables (the storage of
	// UserDataResource) written the way a fenced transaction was written
	// before the fence decided at commit: the fence's comparison is the
	// transaction's first statement and holds the scope's floor row
	// locked until the commit, then the rows, with InTransaction called
	// after the first one as UserDataResource's Write calls it. A holder
	// frozen inside such a transaction makes a newer holder's Advance
	// wait for it, and its rows commit when it wakes although a newer
	// token was issued meanwhile.
	CheckFirstResource(ctx context.Context) (UserResource, error)
}

// HolderProcesses is an optional interface that may be implemented by a
// Harness (F4, F5, F12; F4u and F4m with UserDataResources). The command it
// returns runs RunHolder in a separate OS process connected to the same
// lease service and to the resource of kind, which it opens the way the
// harness opens it for the suite (the same storage, the same attempt
// log). A harness with UserDataResources must accept KindUserData and
// KindMarkerFirst, one with OutboxResources KindOutbox; an unknown kind is
// an error.
type HolderProcesses interface {
	HolderCommand(ctx context.Context, kind ResourceKind) (*exec.Cmd, error)
}

// CrashRestarter is an optional interface that may be implemented by a
// Harness (F8). It crashes the backend's server without letting it flush
// or checkpoint, and starts it again on the same data.
type CrashRestarter interface {
	// CrashRestart returns how the crash was done, for the output (e.g.
	// "SIGQUIT to the postmaster: immediate shutdown, WAL recovery"), and
	// the downtime.
	CrashRestart(ctx context.Context) (how string, downtime time.Duration, err error)
}

// UserDataResources is an optional interface that may be implemented by a
// Harness whose backend can fence the caller's own data: rows of the
// caller's tables written in the caller's transaction (PostgreSQL), keys of
// the caller's Txn (etcd). The part store of OpenResource is one user of
// the backend's fence; these resources are another, the one users write.
// Cases F1u, F4u, F4m, F6u, F7u and F10u, and X1's user-data rows, need
// it. Without it, and with AbilityUserData declared absent, they skip.
type UserDataResources interface {
	// UserDataResource returns a client of the suite's own user data. Its
	// Write stores w.Content, w.Writer and w.Token for (w.Scope, w.Part)
	// in at least two user tables (keys) of the harness's own, not the
	// library's part store, all in one atomic operation (one transaction,
	// one Txn) that also runs the fence's check of
	// backendkit.ClaimOf(w) through the backend's public fence API, the
	// same calls a user makes. When the fence rejects, nothing is stored
	// and Write returns Result{Accepted: false, Floor: the floor that
	// beat it}, not an error; bad input is an error wrapping
	// leasecore.ErrInvalidArgument that names the field, before anything
	// is sent. Advance raises the floor without writing data.
	//
	// ReadPart reads the first user table's row back (Writer and Token as
	// the user row stores them); Rows reads every user table; Floor is
	// the fence's floor of the scope; Attempts is the fence's attempt log
	// of the scope, kept as Traits.AttemptLog declares.
	//
	// Write calls InTransaction(ctx, w, stmt) once inside its atomic
	// operation, after the first user table's row and before the other
	// rows and the commit (F18 freezes or slows the writer there), with
	// stmt running one more statement of it; a one-request backend calls
	// it while it builds the request.
	//
	// gap, when not nil, runs inside each write after the rows and before
	// the commit, so the write holds whatever it locks while gap runs
	// (F6u); an error from gap abandons the write. A harness that declares
	// AbilityCommitGap absent (its fenced operation is one request,
	// nothing to pause) is only ever given a nil gap.
	UserDataResource(ctx context.Context, gap Gap) (UserResource, error)

	// MarkerFirstResource returns the negative control of F4m, the
	// pattern that looks safe and is not: Prepare writes an accepted
	// "marker" through the backend's fenced part store (leasecore.Write
	// as given, its own atomic operation); Write then stores the user rows
	// in a second atomic operation with no fence, and reports them
	// accepted. It shares storage with UserDataResource: ReadPart and Rows
	// read the same user tables; Floor and Attempts are the part store's,
	// where the markers went.
	MarkerFirstResource(ctx context.Context) (MarkerFirst, error)
}

// UserResource is the suite's own user data behind the backend's fence.
type UserResource interface {
	Resource
	Advancer
	// Rows returns what each user table holds for (scope, part): one
	// entry per table the write stores into (at least two), in a fixed
	// order. It lets the suite see that the tables are written together
	// or not at all.
	Rows(ctx context.Context, scope, part string) ([]UserRow, error)
}

// Advancer raises a scope's floor without writing data (UserResource;
// X1's advance rows, BadInput.Advancer).
type Advancer interface {
	// Advance raises the floor of c.Scope to c.Token without writing any
	// data, in one atomic operation, when c.Token is at least the floor
	// (accepted, Floor = c.Token); otherwise it rejects and changes
	// nothing (Floor = the floor that beat it). A new holder advances
	// right after it acquires, so an old holder cannot write even what
	// the new one has not written yet (F10u). Bad input is an error
	// wrapping leasecore.ErrInvalidArgument that names the field
	// ("scope", "writer", "token"), or context.Canceled for a cancelled
	// context, before anything is sent.
	Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error)
}

// UserRow is one user table's row for a (scope, part).
type UserRow struct {
	Table string // the user table or key prefix, e.g. "conformance_job_run"
	Found bool   // false when the table holds no row for it
	Row   leasecore.StoredPart
}

// MarkerFirst is the negative control of UserDataResources: a resource
// whose write takes two atomic operations, the fenced marker (Prepare) and
// the unfenced rows (Write).
type MarkerFirst interface {
	Resource
	Preparer
	// Rows is UserResource.Rows on the same user tables.
	Rows(ctx context.Context, scope, part string) ([]UserRow, error)
}

// Preparer is an optional interface that may be implemented by a resource
// whose write takes two steps (the marker-first control). A holder
// process's PREPARE command calls it with the holder's token; for a
// resource without it, PREPARE answers "PREPARED none" and does nothing.
type Preparer interface {
	// Prepare does the first step of writing w and says whether the fence
	// accepted it.
	Prepare(ctx context.Context, w leasecore.Write) (leasecore.Result, error)
}

// OutboxResources is an optional interface that may be implemented by a
// Harness whose backend can hold a fenced outbox (F9b): a side effect the
// downstream system cannot fence (a "report published" message) recorded
// as an entry in the same atomic operation as the data it announces, under
// the fence's check, and delivered afterwards by a relay with the writer's
// token as its version (leasecore.OutboxEntry). Both outboxes share one
// storage; the suite gives each order of its timeline a scope of its own.
// A harness with HolderProcesses must also accept KindOutbox: F9b kills a
// relay process with SIGKILL mid-delivery.
type OutboxResources interface {
	// FencedOutbox returns a client of the harness's outbox written
	// through the backend's public fence and outbox API, the calls a user
	// makes. Its Write stores, in one atomic operation (one transaction,
	// one Txn) that runs the fence's check of backendkit.ClaimOf(w), the
	// data — w.Content for (w.Scope, w.Part) in a table or key of the
	// harness's, which ReadPart reads — and one outbox entry: Scope,
	// Writer and Token of w, Topic w.Part, Payload w.Content. When the
	// fence rejects, neither is stored and Write returns Result{Accepted:
	// false, Floor: the floor that beat it}, not an error.
	FencedOutbox(ctx context.Context) (Outbox, error)

	// UnfencedOutbox returns the negative control: the same storage, but
	// its Write stores the data and the entry with no fence check at all
	// (a transaction of its own; always accepted, the floor untouched).
	// Its Relay and Pending are FencedOutbox's.
	UnfencedOutbox(ctx context.Context) (Outbox, error)
}

// Outbox is a fenced outbox as the suite uses it (OutboxResources).
type Outbox interface {
	Resource
	Advancer
	OutboxRelay
	// Pending returns the entries of scope not yet delivered, oldest
	// first, as the backend reads them.
	Pending(ctx context.Context, scope string) ([]leasecore.OutboxEntry, error)
}

// OutboxRelay is an outbox's relay. The resource a holder process opens
// for KindOutbox implements it; the holder's RELAY command runs it.
type OutboxRelay interface {
	// Relay is the backend's relay, one pass: it delivers the pending
	// entries of every scope, oldest first, through deliver, marks each
	// delivered only after deliver returned nil for it, stops at
	// deliver's first error (that entry stays pending), and returns how
	// many it marked once none is pending.
	Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error)
}
