package torture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// etcdServer is a single-member etcd (etcdtemp: a child process of this
// binary) with every key of one run under a fresh prefix.
type etcdServer struct {
	srv    *etcdtemp.Server
	cli    *clientv3.Client // the parent's reads, straight to the server
	prefix string
}

// startEtcd starts the server; the binary's TestMain must call
// etcdtemp.Serve when etcdtemp.IsServeProcess.
func startEtcd(ctx context.Context) (*etcdServer, error) {
	srv, err := etcdtemp.Start(ctx)
	if err != nil {
		return nil, err
	}
	cli, err := dialEtcd(srv.Endpoints())
	if err != nil {
		_ = srv.Stop()
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &etcdServer{srv: srv, cli: cli, prefix: "/torture-" + hex.EncodeToString(b[:])}, nil
}

// dialEtcd opens a client that reconnects quickly after a server crash or
// a held proxy (gRPC's default backoff grows to two minutes).
func dialEtcd(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		Logger:      zap.NewNop(),
		DialTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		})},
	})
}

func (s *etcdServer) name() string    { return "etcd" }
func (s *etcdServer) backend() string { return "etcd" }

func (s *etcdServer) targets() []string {
	return []string{strings.TrimPrefix(s.srv.Endpoints()[0], "http://")}
}

func (s *etcdServer) holderSpec(proxyAddrs []string) holderSpec {
	return etcdHolderSpec(proxyAddrs, s.prefix)
}

// etcdHolderSpec gives a holder's client every proxy as an endpoint: one
// for a single server, one per member of a cluster.
func etcdHolderSpec(proxyAddrs []string, prefix string) holderSpec {
	eps := make([]string, len(proxyAddrs))
	for i, a := range proxyAddrs {
		eps[i] = "http://" + a
	}
	return holderSpec{Backend: "etcd", Endpoints: eps, Prefix: prefix}
}

// crash kills the server process with SIGKILL and starts it again on the
// same data directory (etcdtemp.Server.KillRestart): every write it
// acknowledged was fsynced to its WAL first.
func (s *etcdServer) crash(ctx context.Context) (time.Duration, string, error) {
	d, err := s.srv.KillRestart(ctx)
	return d, "SIGKILL of the etcd process, restart on the same data directory", err
}

// userKey is the key of one part in one user "table"; the names need no
// escaping (scope and part names are plain), but a scope is escaped like
// fenceetcd's own keys in case.
func userKey(prefix, table, scope string, part int) string {
	return prefix + "/user/" + table + "/" + url.PathEscape(scope) + "/" + partName(part)
}

// floorKey is the fence's floor key of scope, as fenceetcd.Fence documents
// its layout: <prefix>/floor/<scope>, a 20-digit zero-padded decimal.
func floorKey(prefix, scope string) string { return prefix + "/floor/" + url.PathEscape(scope) }

// read reads the floor and both tables in one Txn of Gets (one revision).
func (s *etcdServer) read(ctx context.Context, scope string, _ flavor) (Snapshot, error) {
	return readEtcd(ctx, s.cli, s.prefix, scope)
}

// readEtcd reads scope's floor and both tables under prefix in one Txn of
// Gets: one revision, and linearizable on any member of a cluster (etcd
// serves a read-only Txn that is not serializable after a ReadIndex: the
// leader confirms with a quorum that it still leads, and the member waits
// until it applied the log that far).
func readEtcd(ctx context.Context, cli *clientv3.Client, prefix, scope string) (Snapshot, error) {
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(floorKey(prefix, scope)),
		clientv3.OpGet(prefix+"/user/"+tableNames[0]+"/"+url.PathEscape(scope)+"/", clientv3.WithPrefix()),
		clientv3.OpGet(prefix+"/user/"+tableNames[1]+"/"+url.PathEscape(scope)+"/", clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if snap.Floor, err = strconv.ParseUint(string(kvs[0].Value), 10, 64); err != nil {
			return Snapshot{}, fmt.Errorf("floor of %q: %w", scope, err)
		}
	}
	for t := range tableNames {
		for _, kv := range resp.Responses[1+t].GetResponseRange().Kvs {
			key := string(kv.Key)
			p := partIndex(key[strings.LastIndexByte(key, '/')+1:])
			if p < 0 {
				return Snapshot{}, fmt.Errorf("key %q is no part any write makes", key)
			}
			var v etcdValue
			if err := json.Unmarshal(kv.Value, &v); err != nil {
				return Snapshot{}, fmt.Errorf("key %q: %w", key, err)
			}
			snap.Tables[t][p] = Cell{Token: v.Token, Content: v.Content}
		}
	}
	return snap, nil
}

func (s *etcdServer) close() error {
	_ = s.cli.Close()
	return s.srv.Stop()
}

// etcdValue is the value of a user key.
type etcdValue struct {
	Token   uint64 `json:"token"`
	Content string `json:"content"`
	Writer  string `json:"writer"`
}

// The holder's side.

func openEtcdHolder(_ context.Context, spec holderSpec) (*holderBackend, error) {
	cli, err := dialEtcd(spec.Endpoints)
	if err != nil {
		return nil, err
	}
	prefix := fenceetcd.WithPrefix(spec.Prefix)
	lease, err := fenceetcd.NewLeaseStore(cli, prefix)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	be := &holderBackend{lease: lease, close: func() { _ = lease.Close(); _ = cli.Close() }}
	switch spec.Flavor {
	case flavorFenced:
		fence, err := fenceetcd.NewFence(cli, prefix)
		if err != nil {
			be.close()
			return nil, err
		}
		be.data = &etcdFenced{fence: fence, prefix: spec.Prefix}
	case flavorUnfenced:
		be.data = &etcdUnfenced{kv: cli.KV, prefix: spec.Prefix}
	default:
		be.close()
		return nil, fmt.Errorf("etcd: unknown flavor %q", spec.Flavor)
	}
	return be, nil
}

// puts are the operations of one write: each part in both tables.
func puts(prefix string, c leasecore.Claim, parts []int, content string) []clientv3.Op {
	v, _ := json.Marshal(etcdValue{Token: uint64(c.Token), Content: content, Writer: c.Writer})
	ops := make([]clientv3.Op, 0, 2*len(parts))
	for _, t := range tableNames {
		for _, p := range parts {
			ops = append(ops, clientv3.OpPut(userKey(prefix, t, c.Scope, p), string(v)))
		}
	}
	return ops
}

// etcdFenced is the library: the puts are the Then of a fenceetcd.Fence
// Commit, one Txn guarded by the floor (Fence.Guard) once Advance set it.
type etcdFenced struct {
	fence  *fenceetcd.Fence
	prefix string
}

func (f *etcdFenced) Fenced() bool { return true }

func (f *etcdFenced) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return f.fence.Advance(ctx, c)
}

// Write's transaction is its one Txn: it is "inside" from the moment the
// Txn goes out until the answer, and no work can go inside it.
func (f *etcdFenced) Write(ctx context.Context, c leasecore.Claim, parts []int, content string, probe *txProbe) (leasecore.Result, error) {
	probe.inside()
	res, _, err := f.fence.Commit(ctx, c, fenceetcd.Txn{Then: puts(f.prefix, c, parts, content)})
	return res, err
}

// etcdUnfenced is the negative control: the same puts in one Txn, no guard.
type etcdUnfenced struct {
	kv     clientv3.KV
	prefix string
}

func (u *etcdUnfenced) Fenced() bool { return false }

func (u *etcdUnfenced) Advance(context.Context, leasecore.Claim) (leasecore.Result, error) {
	return leasecore.Result{}, errors.ErrUnsupported
}

func (u *etcdUnfenced) Write(ctx context.Context, c leasecore.Claim, parts []int, content string, probe *txProbe) (leasecore.Result, error) {
	probe.inside()
	if _, err := u.kv.Txn(ctx).Then(puts(u.prefix, c, parts, content)...).Commit(); err != nil {
		return leasecore.Result{}, err
	}
	return leasecore.Result{Accepted: true}, nil
}
