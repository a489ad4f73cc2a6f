package backendkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/internal/validate"
)

// MaxBatchParts is the largest number of parts in one leasecore.Batch. The
// content of all parts together is limited to MaxContentLen.
const MaxBatchParts = 64

// BatchWriter is an optional interface that may be implemented by a
// leasecore.FencedResource. WriteBatch compares b.Token with the scope's
// floor once and, when it is accepted, stores every part in the same atomic
// operation (one commit); otherwise it stores none. Each part's attempt is
// logged. Without it, a caller writes the parts one by one, and a newer
// holder can get in between: the first parts accepted, the rest rejected.
type BatchWriter interface {
	WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error)
}

// CheckBatch validates a batch: scope, writer, token and space as for a Write,
// 1 to MaxBatchParts parts with distinct valid names, each content valid,
// and all content together at most MaxContentLen bytes.
func CheckBatch(ctx context.Context, b leasecore.Batch) error {
	const op = "write batch"
	if err := CheckName(op, "scope", b.Scope); err != nil {
		return err
	}
	if err := CheckName(op, "writer", b.Writer); err != nil {
		return err
	}
	if err := CheckToken(op, b.Token); err != nil {
		return err
	}
	if err := CheckSpace(op, b.Space); err != nil {
		return err
	}
	if len(b.Parts) == 0 || len(b.Parts) > MaxBatchParts {
		return &leasecore.ArgError{Op: op, Field: "parts", Value: fmt.Sprint(len(b.Parts)),
			Reason: fmt.Sprintf("must hold 1 to %d parts", MaxBatchParts)}
	}
	seen := make(map[string]int, len(b.Parts))
	total := 0
	for i, p := range b.Parts {
		if err := CheckName(op, fmt.Sprintf("parts[%d].part", i), p.Part); err != nil {
			return err
		}
		if j, dup := seen[p.Part]; dup {
			return &leasecore.ArgError{Op: op, Field: fmt.Sprintf("parts[%d].part", i), Value: Quote(p.Part),
				Reason: fmt.Sprintf("repeats parts[%d]", j)}
		}
		seen[p.Part] = i
		if err := checkContent(op, fmt.Sprintf("parts[%d].content", i), p.Content); err != nil {
			return err
		}
		total += len(p.Content)
	}
	if total > MaxContentLen {
		return &leasecore.ArgError{Op: op, Field: "parts", Value: fmt.Sprintf("%d bytes", total),
			Reason: fmt.Sprintf("content of all parts together is larger than %d bytes", MaxContentLen)}
	}
	return CheckContext(op, ctx)
}

// BatchRenewer is an optional interface that may be implemented by a
// leasecore.Lease; leasecore.NewSessionSet requires it. A holder that owns
// many leases (shard ownership) renews them all in one operation instead of
// one round trip per name. Each lease keeps its own token and its own
// holding period; the rules of Lease.Renew apply to each.
//
// RenewAll returns, in the order of gs, the renewed grant (with a new
// Start) or, in lost[i], an error wrapping leasecore.ErrLost for a grant whose hold
// is over; lost[i] is nil for a renewed grant. err is for the operation as
// a whole (bad input, backend unavailable), and then nothing was renewed
// for certain.
type BatchRenewer interface {
	RenewAll(ctx context.Context, gs []leasecore.Grant) (renewed []leasecore.Grant, lost []error, err error)
}

// MaxRenewAll is the largest number of grants in one RenewAll.
const MaxRenewAll = 10000

// CheckRenewAll validates the grants of RenewAll: 1 to MaxRenewAll valid
// grants of one holder, with distinct names.
func CheckRenewAll(ctx context.Context, gs []leasecore.Grant, minTTL time.Duration) error {
	const op = "renew all"
	if len(gs) == 0 || len(gs) > MaxRenewAll {
		return &leasecore.ArgError{Op: op, Field: "grants", Value: fmt.Sprint(len(gs)),
			Reason: fmt.Sprintf("must hold 1 to %d grants", MaxRenewAll)}
	}
	// A holder renews the same hundreds of names every interval, so the
	// checks are sized for that: gs[0] gets CheckGrant, and every other
	// grant only the checks whose outcome can differ from gs[0]'s — its
	// name, token and TTL, its holder only when it is not gs[0]'s (it must
	// be), its space only when it is not the one before it — and one map
	// insert for repeats. A grant with one fault gets the error it got
	// from a full CheckGrant and a map lookup and insert per grant, at half
	// the CPU (BenchmarkCheckRenewAll: 2.5 µs for 100 grants, not 4.8).
	if err := CheckGrant(ctx, op, gs[0], minTTL); err != nil {
		return inGrant(0, err)
	}
	seen := make(map[string]struct{}, len(gs))
	seen[gs[0].Name] = struct{}{}
	for i := 1; i < len(gs); i++ {
		g := &gs[i]
		if err := CheckName(op, "name", g.Name); err != nil {
			return inGrant(i, err)
		}
		if err := CheckToken(op, g.Token); err != nil {
			return inGrant(i, err)
		}
		if err := CheckTTL(op, g.TTL, minTTL); err != nil {
			return inGrant(i, err)
		}
		if g.Space != gs[i-1].Space {
			if err := CheckSpace(op, g.Space); err != nil {
				return inGrant(i, err)
			}
		}
		if g.Holder != gs[0].Holder {
			if err := CheckName(op, "holder", g.Holder); err != nil {
				return inGrant(i, err)
			}
			return &leasecore.ArgError{Op: op, Field: fmt.Sprintf("grants[%d].holder", i), Value: Quote(g.Holder),
				Reason: fmt.Sprintf("differs from grants[0].holder %s: one call renews one holder's leases", Quote(gs[0].Holder))}
		}
		seen[g.Name] = struct{}{}
		if len(seen) == i { // did not grow: an earlier grant has this name
			j := slices.IndexFunc(gs[:i], func(h leasecore.Grant) bool { return h.Name == g.Name })
			return &leasecore.ArgError{Op: op, Field: fmt.Sprintf("grants[%d].name", i), Value: Quote(g.Name),
				Reason: fmt.Sprintf("repeats grants[%d]", j)}
		}
	}
	return nil
}

// inGrant puts grant i's index in front of err's field when err is an
// *leasecore.ArgError.
func inGrant(i int, err error) error {
	if ae := (*leasecore.ArgError)(nil); errors.As(err, &ae) {
		ae.Field = fmt.Sprintf("grants[%d].%s", i, ae.Field)
	}
	return err
}

// BatchAcquirer is an optional interface that may be implemented by a
// leasecore.Lease. A holder that starts with many names (shard ownership)
// acquires them in one call instead of one round trip, and one durable
// commit, per name. leasecore.SessionSet.AcquireAll uses it when its lease has
// it.
//
// AcquireAll judges each name by the rules of Lease.Acquire, on its own:
// a name that is free, expired or released is granted to holder for ttl
// with a token strictly larger than every token issued for it before; a
// name with an unexpired holding period (whoever holds it, holder
// included) is refused and left unchanged. The call is not all or none:
// some names may be granted and others refused.
//
// It returns, in the order of names, grants[i] when errs[i] is nil, or in
// errs[i] what Acquire would have returned for names[i]: a *leasecore.HoldError
// wrapping leasecore.ErrHeld, or an error wrapping leasecore.ErrUnavailable or ctx's error
// when the request of that name alone failed (the grants of the other
// names stand). Tokens are per name, as always; two names of one call may
// get the same token value (an etcd transaction's revision), which says
// nothing about either (see leasecore.ErrTokenSpace: tokens compare within one name).
// Each grant's Start is read before the request that granted it, as
// Acquire's (or dated back, as Acquire's may be).
//
// err is for the call as a whole: bad input (CheckAcquireAll, and the
// backend's own limits), the backend unavailable, ctx done. Then grants and
// errs are nil and the caller holds none of the names: whatever the
// backend may have granted before it failed is given back or undone by
// AcquireAll itself, or, where the backend's Acquire leaves an unknown
// outcome to expiry, left to lapse unrenewed within ttl, as Acquire's
// would be (each backend documents which it does). Such a name may read
// as held until then, and acquiring it again meanwhile is refused with
// leasecore.ErrHeld.
type BatchAcquirer interface {
	AcquireAll(ctx context.Context, names []string, holder string, ttl time.Duration) (grants []leasecore.Grant, errs []error, err error)
}

// MaxAcquireAll is the largest number of names in one AcquireAll (and one
// leasecore.SessionSet.AcquireAll). It keeps one call's request bounded (PostgreSQL:
// one parameter of at most MaxAcquireAll * MaxNameLen bytes of names, about
// 200 kB; etcd: at most 8 transactions of 128 puts) and its answer quick
// enough for the TTLs a holder uses: a holder with more names calls it once
// per MaxAcquireAll of them.
const MaxAcquireAll = 1000

// CheckAcquireAll validates the arguments of BatchAcquirer.AcquireAll: 1
// to MaxAcquireAll distinct names, each valid as Lease.Acquire's name (the field
// of an error is "names[i]"), holder and ttl as for Acquire, and ctx not
// done. leasecore.SessionSet.AcquireAll applies the same rules, with minTTL 0.
func CheckAcquireAll(ctx context.Context, names []string, holder string, ttl, minTTL time.Duration) error {
	const op = "acquire all"
	if err := arg(op, validate.AcquireAll(names, holder, ttl, minTTL)); err != nil {
		return err
	}
	return CheckContext(op, ctx)
}
