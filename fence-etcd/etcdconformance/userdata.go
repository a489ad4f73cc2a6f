package etcdconformance

import (
	"context"
	"fmt"
	"net/url"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The suite's user data (conformance.UserDataResources) on etcd: two user
// "tables", key prefixes under the harness's prefix,
//
//	<prefix>/user/job_run/<scope>/<part>   JSON {content, writer, token, written_at}
//	<prefix>/user/job_line/<scope>/<part>  the same record
//
// scope and part escaped with url.PathEscape, as fenceetcd's own layout
// does, so a "/" in a name never makes two (scope, part) pairs share a key.
// The fenced user resource writes both keys in one fenceetcd.Fence.Commit
// (the public fence API, the same calls a user makes) of a Fence on the
// harness's prefix: its floors and attempt log are the part store's keys,
// so Floor and Attempts read the fence's own. The marker-first control
// writes its marker through the part store (fenceetcd.Resource.Write) and
// then both user keys in a second, unfenced Txn.

// userTables are the user tables' names, in the order Rows returns them;
// the first is ReadPart's.
var userTables = [2]string{"job_run", "job_line"}

// userKey is the key of (scope, part) in a user table under prefix.
func userKey(prefix, table, scope, part string) string {
	return prefix + "/user/" + table + "/" + url.PathEscape(scope) + "/" + url.PathEscape(part)
}

// userData is the storage the fenced user resource and the marker-first
// control share: the user keys under one prefix.
type userData struct {
	kv     clientv3.KV
	prefix string
}

// puts are the operations that store w in every user table.
func (d userData) puts(w leasecore.Write) []clientv3.Op {
	rec := etcdkv.NewPartRecord(w).Encode()
	ops := make([]clientv3.Op, 0, len(userTables))
	for _, t := range userTables {
		ops = append(ops, clientv3.OpPut(userKey(d.prefix, t, w.Scope, w.Part), rec))
	}
	return ops
}

// Rows reads (scope, part) in every user table, in one Txn of Gets, so
// that the tables are read at one revision.
func (d userData) Rows(ctx context.Context, scope, part string) ([]conformance.UserRow, error) {
	const op = "rows"
	if err := etcdkv.CheckRead(ctx, op, scope, part); err != nil {
		return nil, err
	}
	gets := make([]clientv3.Op, 0, len(userTables))
	for _, t := range userTables {
		gets = append(gets, clientv3.OpGet(userKey(d.prefix, t, scope, part)))
	}
	resp, err := d.kv.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	rows := make([]conformance.UserRow, 0, len(userTables))
	for i, t := range userTables {
		row := conformance.UserRow{Table: t}
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			rec, err := etcdkv.DecodePart(string(kvs[0].Key), kvs[0].Value)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
			}
			row.Found, row.Row = true, rec.StoredPart(scope, part)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// ReadPart reads the first user table's row.
func (d userData) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	rows, err := d.Rows(ctx, scope, part)
	if err != nil {
		return leasecore.StoredPart{}, false, err
	}
	return rows[0].Row, rows[0].Found, nil
}

// userResource is the fenced user resource: every write is one
// fenceetcd.Fence.Commit whose Then puts both user keys. It has no
// Prepare: its write is one step.
type userResource struct {
	userData
	fence *fenceetcd.Fence
}

var _ conformance.UserResource = (*userResource)(nil)

// newUserResource returns the fenced user resource on cli under prefix,
// its fence logging every attempt.
func newUserResource(cli *clientv3.Client, prefix string) (*userResource, error) {
	fence, err := fenceetcd.NewFence(cli, fenceetcd.WithPrefix(prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
	if err != nil {
		return nil, err
	}
	return &userResource{userData: userData{kv: cli.KV, prefix: prefix}, fence: fence}, nil
}

// Write implements leasecore.FencedResource: both user keys and the
// fence's check in one Fence.Commit. A rejection stores nothing.
func (u *userResource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	// The Txn is built here and sent at once: InTransaction runs while it
	// is built, and its statement is one more operation, a read of the
	// first user key, added to the Txn.
	ops := u.puts(w)
	get := clientv3.OpGet(string(ops[0].KeyBytes()))
	err := conformance.InTransaction(ctx, w, func(context.Context) error { ops = append(ops, get); return nil })
	if err != nil {
		return leasecore.Result{}, err
	}
	res, _, err := u.fence.Commit(ctx, backendkit.ClaimOf(w), fenceetcd.Txn{Then: ops})
	return res, err
}

// Advance implements conformance.Advancer with the fence's Advance.
func (u *userResource) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	if err := backendkit.CheckClaim(ctx, "advance", c); err != nil {
		return leasecore.Result{}, err
	}
	return u.fence.Advance(ctx, c)
}

// Floor implements backendkit.ResourceReader: the fence's floor.
func (u *userResource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return u.fence.Floor(ctx, scope)
}

// Attempts implements backendkit.ResourceReader: the fence's attempt log,
// read with Fence.Attempts, every entry. A log longer than one read
// (backendkit.MaxAttemptsRead) is an error rather than a truncated answer:
// no case writes that many.
func (u *userResource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	if err := etcdkv.CheckRead(ctx, "attempts", scope); err != nil {
		return nil, err
	}
	as, err := u.fence.Attempts(ctx, leasecore.AttemptQuery{Scope: scope, Limit: backendkit.MaxAttemptsRead})
	if err != nil {
		return nil, err
	}
	if len(as) == backendkit.MaxAttemptsRead {
		return nil, fmt.Errorf("%s: attempts: the log of scope %q holds %d entries or more, more than this reader returns",
			pkg, scope, backendkit.MaxAttemptsRead)
	}
	return as, nil
}

// markerFirst is the negative control of F4m: the marker through the
// harness's part store, then the user keys in a second Txn with no fence.
type markerFirst struct {
	userData
	parts *fenceetcd.Resource
}

var _ conformance.MarkerFirst = (*markerFirst)(nil)

// newMarkerFirst returns the marker-first control on cli under prefix;
// its part store logs every attempt, as the harness's does.
func newMarkerFirst(cli *clientv3.Client, prefix string) (*markerFirst, error) {
	parts, err := fenceetcd.NewResource(cli, fenceetcd.WithPrefix(prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
	if err != nil {
		return nil, err
	}
	return &markerFirst{userData: userData{kv: cli.KV, prefix: prefix}, parts: parts}, nil
}

// Prepare implements conformance.Preparer: w as a marker in the fenced
// part store, its own Txn.
func (m *markerFirst) Prepare(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	return m.parts.Write(ctx, w)
}

// Write stores w in both user keys in one Txn with no fence: the marker
// was the check, and it may have gone stale since. It keeps no floor
// (Floor 0 in the result), like the unfenced control.
func (m *markerFirst) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	const op = "write"
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	if _, err := m.kv.Txn(ctx).Then(m.puts(w)...).Commit(); err != nil {
		return leasecore.Result{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	return leasecore.Result{Accepted: true}, nil
}

// Floor implements backendkit.ResourceReader: the part store's floor, where
// the markers went.
func (m *markerFirst) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return m.parts.Floor(ctx, scope)
}

// Attempts implements backendkit.ResourceReader: the part store's attempt
// log, the markers'.
func (m *markerFirst) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return m.parts.Attempts(ctx, scope)
}

// UserDataResource implements conformance.UserDataResources on a new
// client. The harness declares conformance.AbilityCommitGap absent (an
// etcd Txn has no point between the fence's compare and the write), so
// the suite never passes a gap; a gap is refused rather than ignored.
func (h *harness) UserDataResource(ctx context.Context, gap conformance.Gap) (conformance.UserResource, error) {
	if gap != nil {
		return nil, fmt.Errorf("%s: user data resource: a commit gap cannot be placed inside one etcd Txn: %w",
			pkg, leasecore.ErrInvalidArgument)
	}
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	return newUserResource(cli, h.prefix)
}

// MarkerFirstResource implements conformance.UserDataResources on a new
// client.
func (h *harness) MarkerFirstResource(ctx context.Context) (conformance.MarkerFirst, error) {
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	return newMarkerFirst(cli, h.prefix)
}
