package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// AcquireQueued implements backendkit.QueuedAcquirer: it acquires lease
// name for holder, and while another holder has it, waits in line until
// the lease is handed over or free. leasecore.Campaign waits with it.
//
// It sends one transaction that creates the lease's key when it does not
// exist (as Acquire does: the token is the transaction's revision) and
// otherwise puts an entry into the lease's waiting line: a key under
// <prefix>/queue/<name>/ attached to the etcd lease the hold will be
// attached to — a new one granted for it, or in shared mode the holder's
// shared lease — which AcquireQueued keeps alive while it waits. The line
// is ordered by the entries' create revisions. Release hands the lease to
// the first entry of the line in its own transaction: it puts the lease's
// key with that waiter's holder and etcd lease and deletes the entry (one
// write when the holder's store knows who waits first, two otherwise: see
// Release), and the waiter's token is that write's revision — larger than
// every token issued before, like every token (the key's mod revision). AcquireQueued watches the key and returns the grant
// when it sees that put. When the key is deleted instead (the holder's
// lease expired, a TakeOver, a Release through a store that does not hand
// over) every waiter tries to create it at once, and one gets it. Each
// waiter also reads the key once per TTL (plus jitter), in case a
// notification was missed.
//
// Grant.Start is the local time read before the last keep-alive (or the
// grant) of the etcd lease the key was handed over with, which may be up
// to TTL/3 before the call returns: the key expires with that lease.
//
// A waiter whose etcd lease expired (its process was paused for longer
// than the TTL) is no longer in line: its entry went with the lease, so no
// release hands it anything; AcquireQueued then joins the line again at
// its end. When ctx ends it leaves the line (the entry is deleted, in
// default mode by revoking its etcd lease, which also deletes a key handed
// to it meanwhile; in shared mode by a transaction that deletes that key
// too) and returns an error wrapping ctx's; clean-ups ctx has no time for
// run in the background as Acquire's do.
//
// Errors are Acquire's (the refusal aside: AcquireQueued does not return
// leasecore.ErrHeld), and leasecore.ErrUnavailable when the watch or the
// keep-alives of the waiter's etcd lease fail (the member has no leader,
// the connection broke, the client closed); it has left the line then.
// Close ends a wait in progress: AcquireQueued leaves the line (with its
// ctx, as above) and returns an error wrapping ErrStoreClosed.
// A holder must not call Acquire for a name it waits in line for through
// the same store.
func (s *LeaseStore) AcquireQueued(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	if err := checkWholeSeconds(opQueued, ttl); err != nil {
		return leasecore.Grant{}, err
	}
	if s.isClosed() {
		return leasecore.Grant{}, fmt.Errorf("%s: %s: %w", pkg, opQueued, ErrStoreClosed)
	}
	w := &waiter{s: s, name: name, holder: holder, ttl: ttl,
		key: s.layout.Lease(name), line: s.layout.QueuePrefix(name)}
	if s.shared {
		if err := s.awaitCleanup(ctx, opQueued, w.key); err != nil {
			return leasecore.Grant{}, err
		}
		w.sl = s.sharedFor(holder, ttl)
	}
	for {
		g, err := w.join(ctx)
		if err != nil || g.Token != 0 {
			return g, err
		}
		g, again, err := w.wait(ctx)
		switch {
		case err != nil:
			w.leave(ctx)
			return leasecore.Grant{}, err
		case !again:
			return g, nil
		}
		// Our entry went with our etcd lease: join the line again.
	}
}

// waiter is one AcquireQueued call.
type waiter struct {
	s            *LeaseStore
	name, holder string
	ttl          time.Duration
	key, line    string       // the lease's key and its line's prefix
	sl           *sharedLease // shared mode: the holder's shared lease

	id        clientv3.LeaseID   // the etcd lease of our entry, and of the hold
	refreshed time.Time          // read before id's grant or its last keep-alive
	entry     string             // our entry in the line
	entryRev  int64              // its create revision
	rev       int64              // the revision up to which the line and the key were seen
	others    []*mvccpb.KeyValue // the line's other entries as seen, by create revision
}

// opQueued names AcquireQueued in its errors.
const opQueued = "acquire queued"

// etcdLease gets the etcd lease for our entry: a new one, or in shared
// mode the holder's shared lease (granted or refreshed as for Acquire).
func (w *waiter) etcdLease(ctx context.Context) error {
	if w.sl != nil {
		id, refreshed, err := w.s.sharedLease(ctx, opQueued, w.sl, w.ttl)
		w.id, w.refreshed = id, refreshed
		return err
	}
	start := time.Now() // before the request, as in Acquire
	lg, err := w.s.leases.Grant(ctx, int64(w.ttl/time.Second))
	if err != nil {
		return etcdkv.MapError(ctx, pkg, opQueued, err)
	}
	w.id, w.refreshed = lg.ID, start
	return nil
}

// join creates the lease's key if it is free, or puts our entry into the
// line; a grant with a token says the lease is ours.
func (w *waiter) join(ctx context.Context) (leasecore.Grant, error) {
	s := w.s
	for retried := false; ; retried = true {
		if err := w.etcdLease(ctx); err != nil {
			return leasecore.Grant{}, err
		}
		before := s.lastRev.Load()
		w.entry, w.others = s.layout.NewQueueEntry(w.name, int64(w.id)), nil
		resp, err := s.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(w.key), "=", 0)).
			Then(clientv3.OpPut(w.key, w.holder, clientv3.WithLease(w.id))).
			Else(clientv3.OpPut(w.entry, w.holder, clientv3.WithLease(w.id)),
				clientv3.OpGet(w.line, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))).
			Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) && w.sl != nil && !retried:
			s.sharedGone(w.id) // expired since we last saw it alive: once more
			continue
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			w.forget()
			return leasecore.Grant{}, fmt.Errorf("%s: %s: the etcd lease expired before the key was written (ttl %v): %w: %w",
				pkg, opQueued, w.ttl, leasecore.ErrUnavailable, err)
		case err != nil:
			// It may have been applied: take back what it may have put.
			if w.sl != nil {
				s.cleanUp(ctx, []cleanupStep{s.unputIfOurs(w.key, w.holder, w.id, before), w.unqueueOf(w.entry)})
			} else {
				s.revoke(ctx, w.id)
			}
			return leasecore.Grant{}, etcdkv.MapError(ctx, pkg, opQueued, err)
		case resp.Succeeded:
			return w.granted(resp.Header.Revision, resp.Header), nil
		}
		w.entryRev, w.rev = resp.Header.Revision, resp.Header.Revision
		for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
			if string(kv.Key) != w.entry {
				w.others = append(w.others, kv)
			}
		}
		return leasecore.Grant{}, nil
	}
}

// forget drops our etcd lease after it was found gone.
func (w *waiter) forget() {
	if w.sl != nil {
		w.s.sharedGone(w.id)
	}
}

// granted is the grant of a hold whose key was put at revision rev with our
// etcd lease. It remembers who stands first in line after us, for our
// Release (see knownHead).
func (w *waiter) granted(rev int64, h *etcdserverpb.ResponseHeader) leasecore.Grant {
	s := w.s
	start := w.refreshed
	if w.sl != nil {
		s.noteRev(rev)
		s.mu.Lock()
		if w.sl.id == w.id && w.sl.refreshed.After(start) {
			start = w.sl.refreshed // renewals of the holder's other names refreshed it since
		}
		s.mu.Unlock()
	}
	token := leasecore.Token(rev)
	var next *mvccpb.KeyValue
	if len(w.others) > 0 {
		next = w.others[0]
	}
	s.rememberHead(w.key, token, next)
	return leasecore.Grant{Name: w.name, Holder: w.holder, Token: token, TTL: w.ttl, Start: start, Space: tokenSpace(h)}
}

// wait waits in line until the lease is ours (a grant), our entry is gone
// (again: join again), or ctx ends.
func (w *waiter) wait(ctx context.Context) (g leasecore.Grant, again bool, err error) {
	s := w.s
	refresh := time.NewTimer(w.ttl / 3)
	defer refresh.Stop()
	check := time.NewTimer(w.checkAfter())
	defer check.Stop()
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		keyCh := s.watcher.Watch(wctx, w.key, clientv3.WithRev(w.rev+1))
		lineCh := s.watcher.Watch(wctx, w.line, clientv3.WithPrefix(), clientv3.WithRev(w.rev+1))
		g, again, resync, err := w.watch(ctx, keyCh, lineCh, refresh, check)
		cancel()
		if err != nil || g.Token != 0 || again {
			return g, again, err
		}
		if !resync {
			continue
		}
		// The watched revisions were compacted: read the state again.
		if g, again, err = w.sync(ctx); err != nil || g.Token != 0 || again {
			return g, again, err
		}
	}
}

// watch handles the events of one pair of watches; resync asks for a new
// read and new watches.
func (w *waiter) watch(ctx context.Context, keyCh, lineCh clientv3.WatchChan, refresh, check *time.Timer) (
	g leasecore.Grant, again, resync bool, err error) {
	for {
		var (
			wresp clientv3.WatchResponse
			open  bool
			isKey bool
		)
		select {
		case <-ctx.Done():
			return g, false, false, fmt.Errorf("%s: %s %q: %w", pkg, opQueued, w.name, ctxError(ctx))
		case <-w.s.closing:
			return g, false, false, fmt.Errorf("%s: %s %q: %w", pkg, opQueued, w.name, ErrStoreClosed)
		case <-refresh.C:
			refresh.Reset(w.ttl / 3)
			if again, err := w.keepAlive(ctx); err != nil || again {
				return g, again, false, err
			}
			continue
		case <-check.C:
			// A missed notification costs at most this: is the key gone?
			// (The watches start again from the read's revision.)
			check.Reset(w.checkAfter())
			g, again, err := w.sync(ctx)
			return g, again, false, err
		case wresp, open = <-keyCh:
			isKey = true
		case wresp, open = <-lineCh:
		}
		switch {
		case !open:
			if ctx.Err() != nil {
				return g, false, false, fmt.Errorf("%s: %s %q: %w", pkg, opQueued, w.name, ctxError(ctx))
			}
			return g, false, false, fmt.Errorf("%s: %s: the watch ended (client closed?): %w", pkg, opQueued, leasecore.ErrUnavailable)
		case wresp.CompactRevision != 0:
			return g, false, true, nil
		case wresp.Err() != nil:
			return g, false, false, etcdkv.MapError(ctx, pkg, opQueued, wresp.Err())
		}
		for _, ev := range wresp.Events {
			if !isKey {
				w.lineEvent(ev)
				continue
			}
			switch {
			case ev.Type == mvccpb.PUT && w.handedOver(ev.Kv):
				w.drainLine(lineCh)
				return w.granted(ev.Kv.ModRevision, wresp.Header), false, false, nil
			case ev.Type == mvccpb.DELETE:
				g, again, err := w.take(ctx)
				if err != nil || g.Token != 0 || again {
					return g, again, false, err
				}
			}
		}
	}
}

// handedOver reports whether a put of the lease's key gave it to us: our
// holder, our etcd lease, after we joined the line.
func (w *waiter) handedOver(kv *mvccpb.KeyValue) bool {
	return clientv3.LeaseID(kv.Lease) == w.id && string(kv.Value) == w.holder && kv.ModRevision > w.entryRev
}

// drainLine applies the line's events already delivered, so that who
// stands first behind us is not an entry that a hand-over before ours
// deleted: one stream carries both watches in revision order, but their
// channels are read in no particular order.
func (w *waiter) drainLine(lineCh clientv3.WatchChan) {
	for {
		select {
		case wresp, open := <-lineCh:
			if !open || wresp.CompactRevision != 0 || wresp.Err() != nil {
				return
			}
			for _, ev := range wresp.Events {
				w.lineEvent(ev)
			}
		default:
			return
		}
	}
}

// lineEvent keeps the line as seen (the entries other than ours, by create
// revision).
func (w *waiter) lineEvent(ev *clientv3.Event) {
	key := string(ev.Kv.Key)
	if key == w.entry {
		return // our own: the key's events say what became of us
	}
	i := slices.IndexFunc(w.others, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == key })
	switch {
	case ev.Type == mvccpb.DELETE && i >= 0:
		w.others = slices.Delete(w.others, i, i+1)
	case ev.Type == mvccpb.PUT && i < 0:
		w.others = append(w.others, ev.Kv) // created after every entry seen: last in line
	}
}

// take tries to create the lease's key, deleting our entry, when it is free
// (after a delete, or when a check found it gone).
func (w *waiter) take(ctx context.Context) (g leasecore.Grant, again bool, err error) {
	s := w.s
	resp, err := s.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.key), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(w.entry), "=", w.entryRev)).
		Then(clientv3.OpPut(w.key, w.holder, clientv3.WithLease(w.id)), clientv3.OpDelete(w.entry)).
		Else(clientv3.OpGet(w.entry, clientv3.WithCountOnly())).
		Commit()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		w.forget()
		return g, true, nil
	case err != nil:
		// The put may have been applied; nobody would know. Leave, which
		// takes it back (see leave), and report the error.
		return g, false, etcdkv.MapError(ctx, pkg, opQueued, err)
	case resp.Succeeded:
		return w.granted(resp.Header.Revision, resp.Header), false, nil
	case resp.Responses[0].GetResponseRange().GetCount() == 0:
		w.forget()
		return g, true, nil // our entry is gone, with our etcd lease
	}
	return g, false, nil // held again: by a faster waiter
}

// sync reads the key and the line again (after a compaction, or the
// periodic check): a key handed to us is ours, a missing key is taken.
func (w *waiter) sync(ctx context.Context) (g leasecore.Grant, again bool, err error) {
	s := w.s
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(w.key),
		clientv3.OpGet(w.line, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))).
		Commit()
	if err != nil {
		return g, false, etcdkv.MapError(ctx, pkg, opQueued, err)
	}
	w.rev = resp.Header.Revision
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	line := resp.Responses[1].GetResponseRange().GetKvs()
	w.others = w.others[:0]
	mine := false
	for _, kv := range line {
		if string(kv.Key) == w.entry {
			mine = true
		} else {
			w.others = append(w.others, kv)
		}
	}
	switch {
	case len(kvs) > 0 && w.handedOver(kvs[0]):
		return w.granted(kvs[0].ModRevision, resp.Header), false, nil
	case !mine:
		w.forget()
		return g, true, nil
	case len(kvs) == 0:
		return w.take(ctx)
	}
	return g, false, nil
}

// keepAlive refreshes our etcd lease; again when it is gone (and our entry
// with it).
func (w *waiter) keepAlive(ctx context.Context) (again bool, err error) {
	if w.sl != nil {
		before := w.id
		if err := w.etcdLease(ctx); err != nil {
			return false, err
		}
		if w.id != before {
			// A new shared lease: ours had expired by our clock. Take our
			// entry out if it is still there, and join again.
			w.s.cleanUp(ctx, []cleanupStep{w.unqueueOf(w.entry)})
			return true, nil
		}
		return false, nil
	}
	start := time.Now() // before the request, as in Renew
	switch err := w.s.keepAlive(ctx, w.id); {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return true, nil
	case err != nil:
		return false, etcdkv.MapError(ctx, pkg, opQueued, err)
	}
	w.refreshed = start
	return false, nil
}

// checkAfter is the pause between two reads of the key in case a
// notification was missed: one TTL and up to waitSpread of jitter.
func (w *waiter) checkAfter() time.Duration {
	return w.ttl + rand.N(waitSpread)
}

// leave takes us out of the line after an error or the end of ctx (best
// effort, see cleanUp): in default mode by revoking our etcd lease, which
// deletes our entry and a key handed to us since; in shared mode by a
// transaction that deletes both.
func (w *waiter) leave(ctx context.Context) {
	if w.sl == nil {
		w.s.revoke(ctx, w.id)
		return
	}
	w.s.cleanUp(ctx, []cleanupStep{w.unqueue()})
}

// unqueue is the shared-mode clean-up step that deletes our entry, and the
// lease's key if it was handed to us (our holder, our etcd lease, put
// after we joined).
func (w *waiter) unqueue() cleanupStep {
	key, entry, holder, id, after := w.key, w.entry, w.holder, w.id, w.entryRev
	return cleanupStep{key: key, run: func(ctx context.Context) error {
		_, err := w.s.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", holder),
				clientv3.Compare(clientv3.LeaseValue(key), "=", id),
				clientv3.Compare(clientv3.ModRevision(key), ">", after)).
			Then(clientv3.OpDelete(key), clientv3.OpDelete(entry)).
			Else(clientv3.OpDelete(entry)).
			Commit()
		return err
	}}
}

// unqueueOf is the clean-up step that deletes one entry.
func (w *waiter) unqueueOf(entry string) cleanupStep {
	return cleanupStep{run: func(ctx context.Context) error {
		_, err := w.s.kv.Delete(ctx, entry)
		return err
	}}
}

// handOverAttempts bounds the transactions of one Release that find the
// line changed (its first waiter left, another joined): after them the
// key is deleted without looking at the line, and the waiters, woken by
// the delete, race for it.
const handOverAttempts = 3

// releaseOrHandOver is Release after its checks: it hands the lease over
// to the first in line (head, when the store knows it, or the one a failed
// compare and a read find), or deletes the key when nobody waits.
func (s *LeaseStore) releaseOrHandOver(ctx context.Context, op, key string, g leasecore.Grant) error {
	head := s.takeHead(key, g.Token)
	for budget := handOverAttempts; ; budget-- {
		lineCheck := budget > 0
		var (
			done bool
			err  error
		)
		switch {
		case head != nil && lineCheck:
			done, err = s.handOver(ctx, op, key, g, head)
		case s.shared:
			var first *mvccpb.KeyValue
			if done, first, err = s.releaseShared(ctx, op, key, g, lineCheck); first != nil {
				head = first
				continue
			}
		default:
			done, err = s.releaseDefault(ctx, op, key, g, lineCheck)
		}
		if err != nil || done {
			return err
		}
		// A compare failed: is the key still g's, and who waits?
		kvs, first, _, err := s.readHolding(ctx, key, g.Name)
		if err != nil {
			return etcdkv.MapError(ctx, pkg, op, err)
		}
		if reason := lostReason(kvs, g); reason != "" {
			return lostHold(op, g, reason)
		}
		if !lineCheck {
			// g's, yet the delete without a line check failed: the key
			// changed between the transaction and the read.
			return lostHold(op, g, "changed concurrently")
		}
		head = first
	}
}

// holdingCmps are the compares of a transaction that ends g's holding
// period: the key still holds it, and with lineCheck nobody waits in its
// line (a compare on the range of the line's prefix, which holds for an
// empty range).
func (s *LeaseStore) holdingCmps(key string, g leasecore.Grant, lineCheck bool) []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, 0, 4)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", int64(g.Token)),
		clientv3.Compare(clientv3.Value(key), "=", g.Holder))
	if lineCheck {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.layout.QueuePrefix(g.Name)), "=", 0).WithPrefix())
	}
	return cmps
}

// handOver is the hand-over transaction: while key is g's and head (the
// first entry of its line) still exists, it puts key with head's holder,
// attached to head's etcd lease, deletes head, and deletes the generation
// keys of both holders (as a default-mode Release does: every store of
// either holder checks their names at its next RenewAll). In default mode
// it then revokes g's etcd lease, which no key is attached to any more.
func (s *LeaseStore) handOver(ctx context.Context, op, key string, g leasecore.Grant, head *mvccpb.KeyValue) (bool, error) {
	next := string(head.Value)
	then := []clientv3.Op{
		clientv3.OpPut(key, next, clientv3.WithLease(clientv3.LeaseID(head.Lease)), clientv3.WithPrevKV()),
		clientv3.OpDelete(string(head.Key)),
		clientv3.OpDelete(s.layout.HolderGenPrefix(g.Holder), clientv3.WithPrefix()),
	}
	if next != g.Holder {
		then = append(then, clientv3.OpDelete(s.layout.HolderGenPrefix(next), clientv3.WithPrefix()))
	}
	cmps := append(s.holdingCmps(key, g, false),
		clientv3.Compare(clientv3.CreateRevision(string(head.Key)), "=", head.CreateRevision))
	resp, err := s.kv.Txn(ctx).If(cmps...).Then(then...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, nil // the waiter's etcd lease is gone, and its entry with it
	case err != nil:
		return false, etcdkv.MapError(ctx, pkg, op, err)
	case !resp.Succeeded:
		return false, nil
	}
	s.holderGensGone(g.Holder)
	s.holderGensGone(next)
	if prev := resp.Responses[0].GetResponsePut().GetPrevKv(); !s.shared && prev != nil && prev.Lease != 0 {
		s.revoke(ctx, clientv3.LeaseID(prev.Lease))
	}
	return true, nil
}

// readHolding reads the lease's key and the first entry of its line (nil
// when nobody waits), in one request.
func (s *LeaseStore) readHolding(ctx context.Context, key, name string) (
	kvs []*mvccpb.KeyValue, head *mvccpb.KeyValue, header *etcdserverpb.ResponseHeader, err error) {
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(key),
		clientv3.OpGet(s.layout.QueuePrefix(name), clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))).
		Commit()
	if err != nil {
		return nil, nil, nil, err
	}
	if line := resp.Responses[1].GetResponseRange().GetKvs(); len(line) > 0 {
		head = line[0]
	}
	return resp.Responses[0].GetResponseRange().GetKvs(), head, resp.Header, nil
}

// knownHead is who stood first in a lease's line when the store last
// looked during a holding period — when its AcquireQueued got the lease
// (the waiter after it), or at a Renew: its Release of that holding period
// hands over to it without reading first.
type knownHead struct {
	token leasecore.Token
	entry *mvccpb.KeyValue
}

// rememberHead records the first in line during the holding period token
// of the lease whose key is key; nil: nobody waits.
func (s *LeaseStore) rememberHead(key string, token leasecore.Token, entry *mvccpb.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.heads[key]; ok && h.token > token {
		return // a later holding period's
	}
	if entry == nil {
		delete(s.heads, key)
		return
	}
	if s.heads == nil {
		s.heads = make(map[string]knownHead)
	}
	s.heads[key] = knownHead{token: token, entry: entry}
}

// takeHead returns, and forgets, the first in line recorded for the
// holding period token of key; nil when none was.
func (s *LeaseStore) takeHead(key string, token leasecore.Token) *mvccpb.KeyValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.heads[key]
	if !ok || h.token > token {
		return nil
	}
	delete(s.heads, key)
	if h.token != token {
		return nil
	}
	return h.entry
}
