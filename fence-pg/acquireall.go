package fencepg

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

var _ backendkit.BatchAcquirer = (*LeaseStore)(nil)

// AcquireAll implements backendkit.BatchAcquirer: it acquires names for
// holder for ttl, each by Acquire's rule, in
//
//   - ONE statement for every name that has no lease row yet, the common
//     case of a holder starting with its shards: it inserts them all with
//     token 1 in one durable commit (with shared leases the same statement
//     also refreshes or starts the holder's session of ttl, as Acquire
//     does, and attaches every new name to it under one random acquire id
//     for the batch). Tokens start
//     at 1 and a lease row is never deleted, so a name without a row was
//     never issued a token;
//   - then one Acquire per name the statement did not insert (its row
//     exists: held, expired or released), which is correct for every
//     state and gives token + 1 or ErrHeld as Acquire does.
//
// grants[i] is names[i]'s grant when errs[i] is nil, with the same fields
// as Acquire's grant: Token 1 for a name of the statement, Space the lease
// schema's token space, Start the time read just before the statement was
// sent (for a name acquired by Acquire afterwards, Acquire's own Start).
// errs[i] is what Acquire returned for names[i]: a *leasecore.HoldError
// wrapping leasecore.ErrHeld, or that name's own failure (the grants of
// the other names stand).
//
// err is for the call as a whole: bad input (backendkit.CheckAcquireAll,
// with MinTTL), or the statement failed; then no name is granted to the
// caller. When the statement's outcome is unknown (the connection broke or
// ctx ended after it was sent):
//
//   - with holder sessions every name of the batch is undone by the
//     batch's acquire id, as Acquire undoes one name (see LeaseStore): at
//     once under ctx, and before the holder's next calls through the store
//     for a minute when that could not be done (ctx had ended). Without
//     it the holder's renewals of its other names would keep the names
//     held for ever. A lost answer that database/sql answered by sending
//     the statement again (lib/pq) is not an unknown outcome here: the
//     second execution returns the names the first one attached as
//     granted.
//   - without holder sessions nothing is undone, exactly as Acquire undoes
//     nothing: a name the statement may have inserted has token 1 and an
//     expiry of its own, now() + ttl, that nobody renews (the caller has
//     no grant to renew), so it is free again within ttl, its token never
//     reused. Until then it reads as held and acquiring it is refused with
//     ErrHeld, as after such an Acquire. The same holds for a lost answer
//     that database/sql answered by sending the statement again (lib/pq):
//     the second execution finds the first one's rows, and their names
//     come back refused with ErrHeld, as a resent Acquire's does.
func (s *LeaseStore) AcquireAll(ctx context.Context, names []string, holder string, ttl time.Duration) (grants []leasecore.Grant, errs []error, err error) {
	const op = "acquire all"
	if err := backendkit.CheckAcquireAll(ctx, names, holder, ttl, MinTTL); err != nil {
		return nil, nil, err
	}
	arg, err := json.Marshal(names)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	stmt, args, retry := s.stmt.acquireAll, []any{string(arg), holder, ttl.Microseconds()}, pgstore.RetrySerialization
	var id int64
	if s.sessions {
		s.undos.retry(ctx, s, holder)
		id = rand.Int64() // names this batch's attachments; 63 random bits, as Acquire's
		stmt, args, retry = s.sess.acquireAll, append(args, id), pgstore.RetryConflicts
	}

	// Read before sending, as Acquire does: the server starts each TTL (or
	// the session's) only when it runs the statement.
	start := time.Now()
	granted := make(map[string]bool, len(names))
	var space string
	err = retry(ctx, func() error {
		clear(granted)
		rows, err := s.db.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			if err := rows.Scan(&name, &space); err != nil {
				return err
			}
			granted[name] = true
		}
		return rows.Err()
	})
	if err != nil {
		err = pgstore.MapError(ctx, pkg, op, err)
		if s.sessions && pgstore.OutcomeUnknown(err) {
			s.undoBatch(ctx, names, holder, id)
		}
		return nil, nil, err
	}

	grants, errs = make([]leasecore.Grant, len(names)), make([]error, len(names))
	for i, name := range names {
		if granted[name] {
			grants[i] = leasecore.Grant{Name: name, Holder: holder, Token: 1, TTL: ttl, Start: start,
				Space: pgsql.TokenSpacePrefix + space}
			continue
		}
		grants[i], errs[i] = s.Acquire(ctx, name, holder, ttl)
	}
	return grants, errs, nil
}

// undoBatch undoes, by the batch's acquire id, every name an AcquireAll
// statement with holder sessions may have attached, when its outcome is
// unknown: each name with the store's undo (as Acquire's), all of them
// within one undoTimeout and under ctx, like every statement of the call.
// A name whose undo could not run (ctx had ended, as it often has: it is
// often why the statement failed), or found nothing while the statement
// may still commit, joins the store's pending undos, tried again before
// the holder's next calls through the store (see undoQueue).
//
// The statement is one transaction: once one undo has ended a hold, the
// statement has committed, and every name it inserted was visible to each
// undo that started after that one. A name that such an undo found
// without the batch's hold was not inserted by the batch (its row existed)
// and needs no retry. The names tried before the first hold was found are
// tried once more, since the statement may have committed between their
// undo and that one.
func (s *LeaseStore) undoBatch(ctx context.Context, names []string, holder string, id int64) {
	until := time.Now().Add(undoGrace)
	uctx, cancel := context.WithTimeout(ctx, undoTimeout)
	defer cancel()
	pending := make([]pendingUndo, 0, len(names))
	failed, committed := ctx.Err() != nil, false
	try := func(u pendingUndo) {
		if failed {
			pending = append(pending, u)
			return
		}
		done, err := s.undo(uctx, u)
		switch {
		case err != nil:
			failed = true
			pending = append(pending, u)
		case done:
			committed = true
		case !committed:
			pending = append(pending, u) // maybe not committed yet
		}
	}
	for _, name := range names {
		try(pendingUndo{name: name, holder: holder, id: id, until: until})
	}
	if committed && !failed {
		// Every name in pending was tried before the first hold was found.
		again := pending
		pending = nil
		for _, u := range again {
			try(u)
		}
		if !failed {
			return // the statement committed, and each of its holds was ended
		}
	}
	for _, u := range pending {
		s.undos.add(u)
	}
}
