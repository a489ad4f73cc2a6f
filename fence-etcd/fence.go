package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Fence is the fence over a scope's floor on etcd, for the caller's own
// keys: the compare a caller puts into its own Txn (Guard), the operation
// that raises the floor to a new holder's token (Advance), and a commit of
// the caller's transaction under the fence that reports accepted or
// rejected with the floor (Commit). It never reads a lease key: it decides
// from the floor only, so any lease backend's tokens can fence it. It is
// safe for concurrent use. Resource, the part store, is built on it.
//
// Keys, under the prefix set by WithPrefix (the same layout as Resource's,
// so a Fence and a Resource with one prefix share their floors), each name
// escaped with url.PathEscape:
//
//	<prefix>/floor/<scope>                         the floor, a 20-digit zero-padded decimal
//	<prefix>/floorspace/<scope>                    "<20-digit token> <space>": the token space of
//	                                               the claim that raised the floor to that token
//	<prefix>/attempt/<scope>/<20-digit ns>-<8 hex> JSON {writer, token, accepted, floor, at}
//	<prefix>/moved/<scope>                         JSON {to, floor, space, at}: the seal of a scope
//	                                               that moved to another cluster (Seal)
//
// # Token spaces
//
// Tokens are comparable only within one lease service (leasecore's
// ErrTokenSpace): a scope is fenced by exactly one. When a claim names its
// token space (leasecore.Claim.Space, e.g. "etcd:<cluster id>" from this
// package's LeaseStore or "postgres:<uuid>" from fencepg's), the
// transaction that raises the floor to its token also puts that space,
// bound to the token, in the floorspace key. A rejection then reads the
// floor and that key (one more request, on the rejection path only; a
// claim without a space reads nothing) and, when both spaces are known and
// differ, returns the rejected Result together with a
// *leasecore.TokenSpaceError (errors.Is leasecore.ErrTokenSpace) naming
// both: a scope fenced by two lease services, not a stale holder. A
// floorspace value whose token is not the floor's (a floor raised by a
// claim without a space, or by an earlier version of this package, which
// writes no floorspace key) says nothing, and the rejection is an ordinary
// one. The guarded transaction of the accepted path is unchanged.
//
// # Moved scopes
//
// A scope moved to another cluster (Seal, Install; leasecore.ScopeSeal) is
// rejected here whatever the token: its floor is leasecore.SealedFloor,
// above every token, and the key <prefix>/moved/<scope> records where it
// went. A rejection by the sealed floor reads that key (one more request,
// on the rejection path only) and comes with a *leasecore.ScopeMovedError
// naming the destination (errors.Is leasecore.ErrScopeMoved).
//
// # Why I3 holds
//
// The floor of a scope is the largest token the fence has let through. It
// only moves up: the only request that writes it is Advance's, which puts
// the token only when the floor is not above it (or absent). A guarded
// transaction never writes the floor; it commits the caller's operations
// only when the floor equals the claim's token at the moment etcd applies
// it. etcd applies a Txn — its compares and the branch they select — as one
// atomic step of its serial apply loop, so no other request falls between
// the compare and the caller's writes. Hence once a token T has been
// accepted (the floor became T), a smaller token t can never again find
// the floor equal to t, and nothing it sends is applied. A caller's
// operations may not write the fence's own keys (Commit refuses them).
//
// # Deciding at commit
//
// This is the promise fencepg's transactions keep too: a fenced
// transaction commits only if, when it commits, no larger token has been
// accepted or advanced for its scope, and a newer holder never waits on
// the fence for an older one. Here it holds by construction: the caller
// builds its operations on its own side and the Txn that Commit sends (or
// the caller's own Txn with Guard) is decided when etcd applies it. A
// holder frozen while it builds them, or slow, holds nothing on the
// server; a newer holder's Advance goes through at once, and the frozen
// holder's Txn is rejected when it is finally sent (the conformance case
// F18 freezes one with SIGSTOP and measures the Advance).
//
// # Round trips
//
// Counted as gRPC calls; TestRoundTrips checks them:
//
//	Commit, floor == token (the same holder again)   Txn
//	Commit, floor absent or below the token          Txn + Range + Txn (advance) + Txn
//	Commit, rejected                                  Txn + Range (+ Put of its log record)
//	                                                  (+ Txn reading floor and space, for a claim with a space)
//	Advance                                           Txn (+ Put of the log record of a rejection)
//	                                                  (+ Txn reading floor and space, as above)
//	Attempts                                          Range
//	PruneAttempts                                     DeleteRange
//
// A new holder calls Advance once right after it acquires; its Commits then
// take the one-request path. A rejection's record is a Put after the
// rejection is known, in every log mode but leasecore.LogNone, so that it
// carries the floor that beat it (an etcd Txn cannot copy one key's value
// into another).
type Fence struct {
	kv      clientv3.KV
	layout  etcdkv.Layout
	log     leasecore.AttemptLog
	observe func(leasecore.FenceEvent) // WithFenceObserver, WithLogger; nil: none
}

// NewFence returns a fence on cli, with keys under the prefix set by
// WithPrefix and the attempt log set by WithAttemptLog (default
// leasecore.LogRejected). A nil cli, an invalid prefix or an invalid log
// mode returns a *leasecore.ArgError. The caller keeps ownership of cli and
// closes it.
func NewFence(cli *clientv3.Client, opts ...Option) (*Fence, error) {
	const op = "new fence"
	if cli == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "client", Reason: "must not be nil"}
	}
	o, l, err := options(op, opts)
	if err != nil {
		return nil, err
	}
	return &Fence{kv: cli.KV, layout: l, log: o.AttemptLog, observe: o.FenceObserver}, nil
}

// Txn is the caller's own transaction, run by Commit under the fence:
// If(If...).Then(Then...).Else(Else...), with the caller's keys, compares
// and branches, exactly as with clientv3.Txn.
//
// Commit nests it in its guarded transaction (clientv3.OpTxn), so the
// caller's compares decide between Then and Else on their own, whatever
// the fence decides. etcd's limit of operations per transaction
// (--max-txn-ops, 128 by default) applies to the nested transaction minus
// the fence's own operations in the outer one: 2 with leasecore.LogAll, 1
// otherwise, so 126 or 127 operations per branch by default. etcd refuses
// a request over the limit as a whole (Commit returns an error wrapping
// leasecore.ErrInvalidArgument and nothing is written).
type Txn struct {
	If   []clientv3.Cmp
	Then []clientv3.Op
	Else []clientv3.Op
}

// Guard returns the compare "the floor of c.Scope equals c.Token", for the
// caller's own clientv3.Txn().If(...): the fence as a value that composes
// with the caller's keys, like concurrency.Mutex.IsOwner.
//
// It holds only when the floor already equals the token: after Advance
// with this claim, or after an earlier accepted Commit of the same holding
// period. It fails for a scope without a floor (etcd fails every value
// compare on a missing key), for a larger floor (a newer holder took
// over) and for a smaller one (Advance was not called). A failing Guard
// does not say which: use Commit, which tells them apart, advances the
// floor when the token is newer, and returns the floor that rejected it.
//
// Guard validates nothing (it returns no error), but a claim Commit or
// Advance would refuse never holds: no floor key for an invalid scope is
// ever written, and no floor is 0. A transaction guarded by hand writes no
// attempt log.
func (f *Fence) Guard(c leasecore.Claim) clientv3.Cmp {
	return guardOf(f.layout.Floor(c.Scope), c.Token)
}

// guardOf is Guard for a floor key the caller has built already.
func guardOf(floorKey string, t leasecore.Token) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(floorKey), "=", etcdkv.EncodeToken(t))
}

// Advance raises the floor of c.Scope to c.Token without writing any data,
// in one transaction:
//
//	If(Value(floor) > enc(c.Token)) Then(Get(floor)) Else(Put(floor, enc(c.Token)))
//
// (The compare is inverted so that a scope without a floor, on which etcd
// fails every value compare, takes the accepting branch.) It is accepted
// when the floor was at most c.Token, and the floor is then c.Token (with a
// c.Space, the same transaction stores it with the floor in the floorspace
// key); it is rejected when the floor is larger, and Result.Floor is that
// floor. A rejection is a Result, not an error — but for a floor from
// another token space, which comes with a *leasecore.TokenSpaceError (see
// Fence).
//
// A new holder calls it right after acquiring: from then on a stale holder
// of the scope is cut off, also before the new holder's first data write,
// and the new holder's Guard holds.
//
// With leasecore.LogAll an accepted Advance logs its attempt in the same
// transaction; a rejection is logged after it (not with leasecore.LogNone).
// If only that log record fails, Advance returns the rejection's Result
// together with the error.
func (f *Fence) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	const op = "advance"
	if err := backendkit.CheckClaim(ctx, op, c); err != nil {
		return leasecore.Result{}, err
	}
	at := time.Now()
	key := f.layout.NewAttempt(c.Scope, at)
	var logAccepted []clientv3.Op
	if f.log == leasecore.LogAll {
		logAccepted = append(logAccepted, clientv3.OpPut(key, etcdkv.NewClaimAttemptRecord(c, true, c.Token, at).Encode()))
	}
	res, err := f.advance(ctx, op, c, logAccepted...)
	if err != nil || res.Accepted {
		if f.observe != nil && res.Accepted {
			f.report(op, c, res, nil)
		}
		return res, err
	}
	err = f.rejected(ctx, op, c, key, etcdkv.NewClaimAttemptRecord(c, false, res.Floor, at))
	f.report(op, c, res, err)
	return res, err
}

// Commit runs the caller's transaction t under the fence for claim c and
// reports whether the fence let it through. In the common case, when the
// floor already equals c.Token, it is one request:
//
//	If(Guard(c))
//	Then(OpTxn(t.If, t.Then, t.Else) [, Put(attempt) with leasecore.LogAll])
//
// (a t without If and Else puts its Then operations straight into the
// guarded branch instead of nesting them).
//
// Accepted: the caller's transaction was applied, atomically with the
// fence's compare, and the returned response is its own (Succeeded says
// which of its branches ran; Responses are its operations' answers;
// Header is the whole request's, with the revision of the commit).
// Rejected: nothing of t was applied, the response is nil, and
// Result.Floor is the larger floor that beat c.Token. A rejection is a
// Result, not an error — but for a floor from another token space, which
// comes with a *leasecore.TokenSpaceError (see Fence).
//
// When the guard fails, Commit reads the floor (a Range: the guarded
// transaction carries no Else branch to read it, which every accepted
// Commit would pay for, etcd carrying a branch it does not run through its
// log). Above c.Token, the claim is rejected; absent or below it (the first
// write of a scope, or of a new holder that did not call Advance), Commit
// advances the floor as Advance does and sends the guarded transaction once
// more — four requests — which fails only if a newer token advanced the
// floor in between (rejected). See Fence for why I3 holds.
//
// That advance is a request of its own, and it stays applied whatever
// follows: when the guarded transaction sent after it is rejected (a newer
// token advanced the floor in between) or fails (ctx ended, connection
// lost), Commit returns the rejection or the error although it raised the
// floor to c.Token. What took effect then is safe — the raise cuts off the
// holders of older tokens, as the claim's own Advance would have — and
// nothing of t was applied, unless the error came after the guarded
// transaction was sent (see below).
//
// An error after a request was sent — ctx ended, the connection was lost,
// no leader: an error wrapping the context's or leasecore.ErrUnavailable —
// leaves the outcome unknown: etcd may have applied t, or not, before the
// answer was lost. Commit does not retry, and the attempt log cannot tell:
// it records accepted attempts only with leasecore.LogAll, and a record
// names the writer, the token and the writer's clock, which nothing
// returned to the caller distinguishes from another Commit of the same
// claim. The caller resolves it with its own keys: read back a key t
// writes (a value, or a mod revision, only this attempt can have written),
// or make t idempotent with a compare on its own key in t.If (e.g.
// Version(key) == 0 for a create, Value(key) != the new value for an
// update) and call Commit again with the same claim: accepted with
// Succeeded false in t's response means t's change is there already (an
// earlier attempt applied it, when nothing else writes that key). A
// rejection of that retry leaves reading the key back as the answer.
//
// t must not write the fence's keys (floors and attempt logs under the
// prefix); such a t, like bad claims and a done context, returns a
// *leasecore.ArgError before anything is sent. A transaction etcd refuses
// as malformed or too large returns an error wrapping
// leasecore.ErrInvalidArgument, and nothing is written.
//
// The attempt is logged as WithAttemptLog says: with leasecore.LogAll an
// accepted attempt's record commits with t; a rejection's record (every
// mode but leasecore.LogNone) is a Put after the rejection is known. If
// only that Put fails, Commit returns the rejection's Result together with
// the error.
func (f *Fence) Commit(ctx context.Context, c leasecore.Claim, t Txn) (leasecore.Result, *clientv3.TxnResponse, error) {
	const op = "commit"
	if err := backendkit.CheckClaim(ctx, op, c); err != nil {
		return leasecore.Result{}, nil, err
	}
	if err := f.checkTxn(op, t); err != nil {
		return leasecore.Result{}, nil, err
	}
	at := time.Now()
	return f.commit(ctx, op, c, t, at, true, func(accepted bool, floor leasecore.Token) etcdkv.AttemptRecord {
		return etcdkv.NewClaimAttemptRecord(c, accepted, floor, at)
	})
}

// recordFunc builds the log record of an attempt once its outcome and the
// floor after it are known.
type recordFunc func(accepted bool, floor leasecore.Token) etcdkv.AttemptRecord

// commit is Commit after validation, for Commit and Resource: at is the
// attempt's time (its log key), record its log record; the response of an
// accepted t is built only when wantResp is set (Resource drops it).
func (f *Fence) commit(ctx context.Context, op string, c leasecore.Claim, t Txn, at time.Time, wantResp bool,
	record recordFunc) (leasecore.Result, *clientv3.TxnResponse, error) {
	floorKey := f.layout.Floor(c.Scope)
	// The attempt's key is drawn only when a record is written (LogAll,
	// or a rejection): the accepted path of the default log does not
	// need it. It is the same key either way (the attempt's time, then
	// random bits), and at most one record of the attempt is stored.
	var attemptKey string
	attempt := func() string {
		if attemptKey == "" {
			attemptKey = f.layout.NewAttempt(c.Scope, at)
		}
		return attemptKey
	}
	// A caller's transaction without compares of its own is its Then
	// branch: its operations go straight into the guarded branch, which
	// etcd applies more cheaply than a nested transaction (measured in
	// docs/performance.md); the caller still gets a response of its own.
	flat := len(t.If) == 0 && len(t.Else) == 0
	var then []clientv3.Op
	switch {
	case !flat:
		then = []clientv3.Op{clientv3.OpTxn(t.If, t.Then, t.Else)}
	case f.log == leasecore.LogAll:
		then = append(make([]clientv3.Op, 0, len(t.Then)+1), t.Then...) // not into the caller's array
	default:
		then = t.Then // Then copies it; nothing is appended
	}
	if f.log == leasecore.LogAll {
		then = append(then, clientv3.OpPut(attempt(), record(true, c.Token).Encode()))
	}
	guard := guardOf(floorKey, c.Token)
	for advanced := false; ; advanced = true {
		// No Else branch reads the floor: etcd carries the operations of a
		// branch it does not run through its log, so every accepted write
		// would pay for a read that only a failed guard needs (measured in
		// docs/performance.md). A failed guard reads it next, on its own.
		resp, err := f.kv.Txn(ctx).If(guard).Then(then...).Commit()
		if err != nil {
			return leasecore.Result{}, nil, etcdkv.MapError(ctx, pkg, op, err)
		}
		if resp.Succeeded {
			if f.observe != nil {
				f.report(op, c, leasecore.Result{Accepted: true, Floor: c.Token}, nil)
			}
			if !wantResp {
				return leasecore.Result{Accepted: true, Floor: c.Token}, nil, nil
			}
			if flat {
				return leasecore.Result{Accepted: true, Floor: c.Token},
					&clientv3.TxnResponse{Header: resp.Header, Succeeded: true, Responses: resp.Responses[:len(t.Then)]}, nil
			}
			inner := (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
			inner.Header = resp.Header // a nested response's header is empty
			return leasecore.Result{Accepted: true, Floor: c.Token}, inner, nil
		}
		// The floor is not c.Token. Above it now, a larger token has
		// been advanced, by this read at the latest: a rejection, with
		// that floor. A floor that is no token (written outside the fence)
		// is an error here, before an advance could overwrite it.
		floor, err := etcdkv.ReadFloor(ctx, f.kv, pkg, op, floorKey)
		if err != nil {
			return leasecore.Result{}, nil, err
		}
		res := leasecore.Result{Floor: floor}
		if floor <= c.Token {
			if advanced {
				// The floor was at least c.Token after our advance and
				// only an advance writes it: someone wrote it outside the
				// fence.
				return leasecore.Result{}, nil, fmt.Errorf("%s: %s: the floor of scope %q is %d right after it was advanced to %d: "+
					"key %q was written outside the fence: %w", pkg, op, c.Scope, floor, c.Token, floorKey, leasecore.ErrConfig)
			}
			// Absent or below: raise it and send the guarded transaction
			// again, unless a larger token raised it first (the advance's
			// compare rejects the claim then, with that floor).
			if res, err = f.advance(ctx, op, c); err != nil {
				return leasecore.Result{}, nil, err
			}
			if res.Accepted {
				continue
			}
		}
		err = f.rejected(ctx, op, c, attempt(), record(false, res.Floor))
		f.report(op, c, res, err)
		return res, nil, err
	}
}

// advance raises the floor of c.Scope to c.Token unless it is larger, in
// one transaction, with c.Space bound to the token in the floorspace key
// (when the claim names one) and extra (the accepted attempt's log record)
// in the accepting branch.
func (f *Fence) advance(ctx context.Context, op string, c leasecore.Claim, extra ...clientv3.Op) (leasecore.Result, error) {
	floorKey, enc := f.layout.Floor(c.Scope), etcdkv.EncodeToken(c.Token)
	raise := []clientv3.Op{clientv3.OpPut(floorKey, enc)}
	if c.Space != "" {
		raise = append(raise, clientv3.OpPut(f.layout.FloorSpace(c.Scope), etcdkv.EncodeFloorSpace(c.Token, c.Space)))
	}
	resp, err := f.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(floorKey), ">", enc)).
		Then(clientv3.OpGet(floorKey)).
		Else(append(raise, extra...)...).
		Commit()
	if err != nil {
		return leasecore.Result{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	if !resp.Succeeded {
		return leasecore.Result{Accepted: true, Floor: c.Token}, nil
	}
	floor, err := etcdkv.FloorOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return leasecore.Result{}, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	return leasecore.Result{Floor: floor}, nil
}

// rejected is what follows a rejection of c: its log record (logRejection)
// and the diagnosis (diagnose) of a sealed scope or of a floor from another
// token space; rec carries the floor that rejected c.
func (f *Fence) rejected(ctx context.Context, op string, c leasecore.Claim, key string, rec etcdkv.AttemptRecord) error {
	logErr := f.logRejection(ctx, op, key, rec)
	return errors.Join(f.diagnose(ctx, op, c, leasecore.Token(rec.Floor)), logErr)
}

// spaceError is the rejection path's diagnosis: when c names its token
// space, it reads the scope's floor and floorspace keys in one read-only
// transaction and returns a *leasecore.TokenSpaceError when the floorspace
// key belongs to the current floor (its token is the floor) and names
// another space. It returns nil for an ordinary rejection and for a claim
// without a space (then nothing is read).
func (f *Fence) spaceError(ctx context.Context, op string, c leasecore.Claim) error {
	if c.Space == "" {
		return nil
	}
	resp, err := f.kv.Txn(ctx).Then(clientv3.OpGet(f.layout.Floor(c.Scope)), clientv3.OpGet(f.layout.FloorSpace(c.Scope))).Commit()
	if err != nil {
		return etcdkv.MapError(ctx, pkg, op+": read the floor's token space", err)
	}
	floor, err := etcdkv.FloorOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil
	}
	token, space, err := etcdkv.DecodeFloorSpace(string(kvs[0].Value))
	if err != nil {
		return fmt.Errorf("%s: %s: key %q: %w", pkg, op, kvs[0].Key, err)
	}
	if token != floor {
		return nil // written with an earlier floor: the current one's space is unknown
	}
	return backendkit.TokenSpaceMismatch(op, c, floor, space)
}

// logRejection stores a rejected attempt's record, unless the log is off.
func (f *Fence) logRejection(ctx context.Context, op, key string, rec etcdkv.AttemptRecord) error {
	if f.log == leasecore.LogNone {
		return nil
	}
	if _, err := f.kv.Put(ctx, key, rec.Encode()); err != nil {
		return etcdkv.MapError(ctx, pkg, op+": log the rejected attempt", err)
	}
	return nil
}

// checkTxn refuses a caller's transaction that writes (puts, or deletes a
// range that reaches) a key the fence owns: a floor written outside
// Advance could move down, and I3 would be gone.
func (f *Fence) checkTxn(op string, t Txn) error {
	if err := f.checkWrites(op, "then", t.Then); err != nil {
		return err
	}
	return f.checkWrites(op, "else", t.Else)
}

func (f *Fence) checkWrites(op, field string, ops []clientv3.Op) error {
	for i, o := range ops {
		name := field + "[" + strconv.Itoa(i) + "]"
		switch {
		case o.IsTxn():
			_, then, els := o.Txn()
			if err := f.checkWrites(op, name+".then", then); err != nil {
				return err
			}
			if err := f.checkWrites(op, name+".else", els); err != nil {
				return err
			}
		case o.IsPut(), o.IsDelete():
			key, end := string(o.KeyBytes()), string(o.RangeBytes())
			for _, p := range f.layout.Fenced() {
				if reaches(key, end, p) {
					return &leasecore.ArgError{Op: op, Field: name, Value: strconv.Quote(key),
						Reason: "writes a key of the fence (" + p + "...): only the fence may write floors and attempt logs"}
				}
			}
		}
	}
	return nil
}

// reaches reports whether the key range [key, end) of a put or delete
// (end "": the key alone; end "\x00": every key from key on) holds a key
// with prefix p.
func reaches(key, end, p string) bool {
	pEnd := clientv3.GetPrefixRangeEnd(p)
	switch end {
	case "":
		return strings.HasPrefix(key, p)
	case "\x00":
		return key < pEnd
	}
	return key < pEnd && end > p
}

// Attempts returns entries of the scope's attempt log at or after q.Since
// (the zero time: from the first), oldest first, at most q.Limit, with one
// range read. The order and the bound are the attempts' times, which are
// the writers' clocks when they began (the keys carry them): across
// writers whose clocks differ it need not be etcd's order of application.
// A batch of Resource.WriteBatch counts as one entry per part. Bad input
// returns a *leasecore.ArgError before anything is sent.
func (f *Fence) Attempts(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error) {
	const op = "attempts"
	if err := backendkit.CheckAttemptQuery(ctx, op, q); err != nil {
		return nil, err
	}
	end := clientv3.GetPrefixRangeEnd(f.layout.AttemptPrefix(q.Scope))
	resp, err := f.kv.Get(ctx, f.layout.AttemptsAt(q.Scope, q.Since), clientv3.WithRange(end),
		clientv3.WithLimit(int64(q.Limit)))
	if err != nil {
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	out, err := etcdkv.DecodeAttempts(q.Scope, resp.Kvs, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	return out, nil
}

// Floor returns the scope's floor, 0 when the scope never accepted a
// check: one Range. For dashboards and tests; nothing should decide to
// write from it (the answer is stale when it arrives): Commit decides.
func (f *Fence) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return etcdkv.Reader{KV: f.kv, Layout: f.layout, Pkg: pkg}.Floor(ctx, scope)
}

// PruneAttempts deletes the entries of the scope's attempt log made before
// before (by their writers' clocks, see Attempts) with one DeleteRange and
// returns how many keys it deleted (a batch's entry is one key). before
// must be set and not in the future; bad input returns a
// *leasecore.ArgError before anything is sent. Floors are never pruned.
func (f *Fence) PruneAttempts(ctx context.Context, scope string, before time.Time) (int64, error) {
	const op = "prune attempts"
	if err := backendkit.CheckPrune(ctx, op, scope, before); err != nil {
		return 0, err
	}
	resp, err := f.kv.Delete(ctx, f.layout.AttemptPrefix(scope), clientv3.WithRange(f.layout.AttemptsAt(scope, before)))
	if err != nil {
		return 0, etcdkv.MapError(ctx, pkg, op, err)
	}
	return resp.Deleted, nil
}
