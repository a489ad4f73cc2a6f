// Package etcdcontrol provides NEGATIVE CONTROLS: etcd resources that are
// WRONG ON PURPOSE. Never use them to protect data.
//
// Each one is a design that looks plausible and fails; the conformance suite
// runs the same timelines against them and against fenceetcd.Resource, to
// show that the failure is real on etcd and that the fenced resource does
// not have it:
//
//   - Unfenced ignores tokens: a stale holder overwrites the newer holder's
//     data (F5).
//   - CheckThenWrite reads the floor, decides, then writes the floor and the
//     part in separate requests: an interleaving makes it accept a stale
//     write and move the floor BACKWARDS (F6a).
//   - RowFenced compares the token with the stored part's own token only: a
//     part the newer holder has not written yet has nothing to compare with,
//     so the stale holder writes it (F7).
//   - IdempotentPublisher deduplicates by business key only: it keeps the
//     first write, not the newest (F9).
//
// They use fenceetcd.Resource's key layout under the same prefix (floor,
// part and attempt keys) and add two kinds of their own (parttoken,
// published). Their Floor, ReadPart and Attempts read those keys exactly as
// fenceetcd.Resource does, and every Write logs an attempt. Inputs are
// validated exactly as in fenceetcd.
package etcdcontrol

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

const pkg = "etcdcontrol"

// Controls makes negative-control resources on one client. It is safe for
// concurrent use, as are the resources it returns.
type Controls struct {
	kv     clientv3.KV
	layout etcdkv.Layout
}

// New returns Controls on cli, with keys under the prefix set by
// fenceetcd.WithPrefix (the fenced resource's prefix, to share its keys). A
// nil cli or an invalid prefix returns a *leasecore.ArgError. The caller
// keeps ownership of cli.
func New(cli *clientv3.Client, opts ...fenceetcd.Option) (*Controls, error) {
	const op = "new controls"
	if cli == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "client", Reason: "must not be nil"}
	}
	_, l, err := etcdkv.ApplyOptions(op, opts)
	if err != nil {
		return nil, err
	}
	return &Controls{kv: cli.KV, layout: l}, nil
}

// Resource is one negative-control resource. It implements
// leasecore.FencedResource — WITHOUT keeping I3 — and
// backendkit.ResourceReader.
type Resource struct {
	op        string // names the control in errors, e.g. "unfenced write"
	write     func(ctx context.Context, w leasecore.Write) (leasecore.Result, error)
	read      etcdkv.Reader
	published bool // ReadPart reads the publication keys
}

var (
	_ leasecore.FencedResource  = (*Resource)(nil)
	_ backendkit.ResourceReader = (*Resource)(nil)
)

func (c *Controls) resource(op string, write func(context.Context, leasecore.Write) (leasecore.Result, error)) *Resource {
	return &Resource{op: op, write: write, read: etcdkv.Reader{KV: c.kv, Layout: c.layout, Pkg: pkg}}
}

// Write validates w as fenceetcd does (bad input and a done context change
// nothing) and then writes it the control's wrong way. Result.Floor is the
// scope's floor key after the attempt (0 when it has none), which only
// CheckThenWrite changes.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	res, err := r.write(ctx, w)
	return res, etcdkv.MapError(ctx, pkg, r.op, err)
}

// Floor implements backendkit.ResourceReader: the scope's floor key, 0 when
// it has none.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.read.Floor(ctx, scope)
}

// ReadPart implements backendkit.ResourceReader: the part key, or for the
// IdempotentPublisher the publication key; ok is false when absent.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	if r.published {
		return r.read.ReadPublished(ctx, scope, part)
	}
	return r.read.ReadPart(ctx, scope, part)
}

// Attempts implements backendkit.ResourceReader: the scope's attempt log,
// oldest first, as fenceetcd.Resource reads it.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.read.Attempts(ctx, scope)
}

// Unfenced returns a resource that ignores tokens: one transaction that
// puts the part and logs the attempt (and reads the floor, for the
// result), always accepted. COUNTEREXAMPLE (F5): a stale holder's write
// overwrites the newer one's.
func (c *Controls) Unfenced() *Resource {
	return c.resource("unfenced write", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		at := time.Now()
		floorKey := c.layout.Floor(w.Scope)
		resp, err := c.kv.Txn(ctx).Then(
			clientv3.OpPut(c.layout.Part(w.Scope, w.Part), etcdkv.NewPartRecord(w).Encode()),
			clientv3.OpPut(c.layout.NewAttempt(w.Scope, at), etcdkv.NewAttemptRecordAt(w, true, 0, at).Encode()),
			clientv3.OpGet(floorKey)).Commit()
		if err != nil {
			return leasecore.Result{}, err
		}
		floor, err := etcdkv.FloorOf(resp.Responses[2].GetResponseRange().Kvs)
		return leasecore.Result{Accepted: true, Floor: floor}, err
	})
}

// CheckThenWrite returns a resource that checks and writes in separate
// requests: it reads the floor (0 if none), rejects (and logs) a token
// below it, calls gap (nil: no pause), then puts the floor to the token
// unconditionally, puts the part and logs the attempt. COUNTEREXAMPLE
// (F6a): the decision is stale by the time it is acted on, so a writer that
// read the floor before a newer writer advanced it still writes, and sets
// the floor BACK to its own smaller token.
func (c *Controls) CheckThenWrite(gap func(ctx context.Context, w leasecore.Write) error) *Resource {
	return c.resource("check-then-write", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		floorKey := c.layout.Floor(w.Scope)
		resp, err := c.kv.Get(ctx, floorKey)
		if err != nil {
			return leasecore.Result{}, err
		}
		floor, err := etcdkv.FloorOf(resp.Kvs)
		if err != nil {
			return leasecore.Result{}, err
		}
		if floor > w.Token {
			rejected := leasecore.Result{Floor: floor}
			return rejected, c.logAttempt(ctx, w, rejected)
		}
		if gap != nil {
			if err := gap(ctx, w); err != nil {
				return leasecore.Result{}, fmt.Errorf("gap: %w", err)
			}
		}
		if _, err := c.kv.Put(ctx, floorKey, etcdkv.EncodeToken(w.Token)); err != nil {
			return leasecore.Result{}, err
		}
		if _, err := c.kv.Put(ctx, c.layout.Part(w.Scope, w.Part), etcdkv.NewPartRecord(w).Encode()); err != nil {
			return leasecore.Result{}, err
		}
		accepted := leasecore.Result{Accepted: true, Floor: w.Token}
		return accepted, c.logAttempt(ctx, w, accepted)
	})
}

func (c *Controls) logAttempt(ctx context.Context, w leasecore.Write, res leasecore.Result) error {
	at := time.Now()
	_, err := c.kv.Put(ctx, c.layout.NewAttempt(w.Scope, at), etcdkv.NewAttemptRecordAt(w, res.Accepted, res.Floor, at).Encode())
	return err
}

// RowFenced returns a resource that compares the token with the stored
// part's own token only, kept in a per-part key <prefix>/parttoken/<scope>/<part>,
// with no scope floor, in one transaction:
//
//	If(Value(parttoken) > enc(w.Token))
//	Then(Put(attempt, rejected), Get(floor))
//	Else(Put(parttoken, enc(w.Token)), Put(part), Put(attempt, accepted), Get(floor))
//
// COUNTEREXAMPLE (F7): a part that does not exist yet has no token to
// compare with — etcd fails a value compare on a missing key — so a stale
// holder writes a part the newer holder has not touched.
func (c *Controls) RowFenced() *Resource {
	return c.resource("row-fenced write", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		at := time.Now()
		partToken, floorKey := c.layout.PartToken(w.Scope, w.Part), c.layout.Floor(w.Scope)
		attempt, enc := c.layout.NewAttempt(w.Scope, at), etcdkv.EncodeToken(w.Token)
		resp, err := c.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(partToken), ">", enc)).
			Then(
				clientv3.OpPut(attempt, etcdkv.NewAttemptRecordAt(w, false, 0, at).Encode()),
				clientv3.OpGet(floorKey)).
			Else(
				clientv3.OpPut(partToken, enc),
				clientv3.OpPut(c.layout.Part(w.Scope, w.Part), etcdkv.NewPartRecord(w).Encode()),
				clientv3.OpPut(attempt, etcdkv.NewAttemptRecordAt(w, true, 0, at).Encode()),
				clientv3.OpGet(floorKey)).
			Commit()
		if err != nil {
			return leasecore.Result{}, err
		}
		res := leasecore.Result{Accepted: !resp.Succeeded}
		get := resp.Responses[len(resp.Responses)-1].GetResponseRange()
		res.Floor, err = etcdkv.FloorOf(get.Kvs)
		return res, err
	})
}

// IdempotentPublisher returns a stand-in for an external side effect that
// only deduplicates by business key (scope, part), tokens ignored, in one
// transaction:
//
//	If(CreateRevision(published) == 0)
//	Then(Put(published, record), Put(attempt, accepted), Get(floor))
//	Else(Put(attempt, rejected), Get(floor))
//
// accepted exactly when the key was created. ReadPart reads the
// publication. COUNTEREXAMPLE (F9): it keeps the first write of a key, not
// the newest — a stale holder that publishes first wins.
func (c *Controls) IdempotentPublisher() *Resource {
	r := c.resource("publish", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		at := time.Now()
		pub, floorKey, attempt := c.layout.Published(w.Scope, w.Part), c.layout.Floor(w.Scope), c.layout.NewAttempt(w.Scope, at)
		resp, err := c.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(pub), "=", 0)).
			Then(
				clientv3.OpPut(pub, etcdkv.NewPartRecord(w).Encode()),
				clientv3.OpPut(attempt, etcdkv.NewAttemptRecordAt(w, true, 0, at).Encode()),
				clientv3.OpGet(floorKey)).
			Else(
				clientv3.OpPut(attempt, etcdkv.NewAttemptRecordAt(w, false, 0, at).Encode()),
				clientv3.OpGet(floorKey)).
			Commit()
		if err != nil {
			return leasecore.Result{}, err
		}
		res := leasecore.Result{Accepted: resp.Succeeded}
		get := resp.Responses[len(resp.Responses)-1].GetResponseRange()
		res.Floor, err = etcdkv.FloorOf(get.Kvs)
		return res, err
	})
	r.published = true
	return r
}
