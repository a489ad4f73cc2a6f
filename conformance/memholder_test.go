package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
)

// Holder processes for the in-memory harness. The state stays in the test
// process; a holder is this test binary run again (TestMain), and reaches
// the leases and resources over net/rpc on a Unix socket. SIGSTOP freezes
// the holder with its session's renewal goroutine, as with a real backend;
// the lease expires by the parent's clock.

// memHolderEnv makes a process a holder; it carries a memHolderSpec.
const memHolderEnv = "LEASEFENCE_MEM_HOLDER"

type memHolderSpec struct {
	Socket string                   `json:"socket"`
	Kind   conformance.ResourceKind `json:"kind"`
	// DropRenewAfterWrite doctors the holder (suite_test.go): once it
	// has written, its renewals fail as a dropped connection does
	// (ErrUnavailable), not with ErrLost.
	DropRenewAfterWrite bool `json:"drop_renew_after_write,omitempty"`
	// RelayMutant breaks a relay process's relay (suite_outbox_test.go).
	RelayMutant relayMutant `json:"relay_mutant,omitempty"`
}

func TestMain(m *testing.M) {
	if os.Getenv(memHolderEnv) != "" {
		var spec memHolderSpec
		os.Exit(conformance.HolderMain(memHolderEnv, &spec, func(ctx context.Context) (leasecore.Lease, leasecore.FencedResource, func(), error) {
			cl, err := rpc.Dial("unix", spec.Socket)
			if err != nil {
				return nil, nil, nil, err
			}
			wrote := new(atomic.Bool)
			var res leasecore.FencedResource = rpcResource{cl, spec.Kind, wrote}
			switch spec.Kind {
			case conformance.KindMarkerFirst:
				res = rpcMarkerFirst{rpcResource{cl, spec.Kind, wrote}}
			case conformance.KindOutbox:
				res = rpcOutbox{rpcResource{cl, spec.Kind, wrote}, spec.RelayMutant}
			}
			var dropAfter *atomic.Bool
			if spec.DropRenewAfterWrite {
				dropAfter = wrote
			}
			return rpcLease{cl, dropAfter}, res, func() { _ = cl.Close() }, nil
		}))
	}
	os.Exit(m.Run())
}

// memHolders serves one harness's state to its holder processes.
type memHolders struct {
	once   sync.Once
	dir    string
	socket string
	ln     net.Listener
	err    error
}

// HolderCommand implements conformance.HolderProcesses.
func (h *memHarness) HolderCommand(ctx context.Context, kind conformance.ResourceKind) (*exec.Cmd, error) {
	if _, err := h.holderResource(ctx, kind); err != nil {
		return nil, err
	}
	hs := &h.holders
	hs.once.Do(func() {
		// A short path: Unix socket paths are limited to about 100 bytes.
		if hs.dir, hs.err = os.MkdirTemp("", "memholder"); hs.err != nil {
			return
		}
		hs.socket = filepath.Join(hs.dir, "s")
		srv := rpc.NewServer()
		if hs.err = srv.RegisterName("Mem", &memService{h}); hs.err != nil {
			return
		}
		if hs.ln, hs.err = net.Listen("unix", hs.socket); hs.err == nil {
			go func(ln net.Listener) {
				for { // until close: rpc.Server.Accept would log the closed listener
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					go srv.ServeConn(conn)
				}
			}(hs.ln)
		}
	})
	if hs.err != nil {
		return nil, hs.err
	}
	return conformance.HolderSelfCommand(ctx, []string{"-test.run=^$"}, memHolderEnv,
		memHolderSpec{Socket: hs.socket, Kind: kind, DropRenewAfterWrite: h.dropRenewAfterWrite, RelayMutant: h.relayMutant})
}

func (hs *memHolders) close() {
	if hs.ln != nil {
		_ = hs.ln.Close()
	}
	if hs.dir != "" {
		_ = os.RemoveAll(hs.dir)
	}
}

// holderResource opens the resource of kind the way the suite gets it.
func (h *memHarness) holderResource(ctx context.Context, kind conformance.ResourceKind) (leasecore.FencedResource, error) {
	switch kind {
	case conformance.KindFenced:
		return h.OpenResource(ctx)
	case conformance.KindUnfenced:
		return h.UnfencedResource(ctx)
	case conformance.KindUserData:
		return h.UserDataResource(ctx, nil)
	case conformance.KindMarkerFirst:
		return h.MarkerFirstResource(ctx)
	case conformance.KindOutbox:
		return h.FencedOutbox(ctx)
	}
	return nil, fmt.Errorf("memfence holder: unknown resource kind %q: %w", kind, leasecore.ErrInvalidArgument)
}

// memService is the RPC side in the test process. Errors travel as text
// plus the sentinel they wrapped, which the holder side wraps again.
type memService struct{ h *memHarness }

// The RPC messages; net/rpc wants exported types.
type (
	AcquireArgs struct {
		Name, Holder string
		TTL          time.Duration
	}
	GrantReply struct {
		Grant    leasecore.Grant
		Err, Sen string
	}
	WriteArgs struct {
		Kind conformance.ResourceKind
		W    leasecore.Write
	}
	ResultReply struct {
		Result   leasecore.Result
		Err, Sen string
	}
)

var sentinels = map[string]error{"held": leasecore.ErrHeld, "lost": leasecore.ErrLost,
	"invalid": leasecore.ErrInvalidArgument, "canceled": context.Canceled}

func encodeErr(err error) (msg, sen string) {
	if err == nil {
		return "", ""
	}
	for name, s := range sentinels {
		if errors.Is(err, s) {
			return err.Error(), name
		}
	}
	return err.Error(), ""
}

func decodeErr(msg, sen string) error {
	if msg == "" {
		return nil
	}
	if s, ok := sentinels[sen]; ok {
		return fmt.Errorf("%s (over rpc): %w", msg, s)
	}
	return errors.New(msg)
}

func (s *memService) Acquire(a AcquireArgs, r *GrantReply) error {
	g, err := s.h.leases.Acquire(context.Background(), a.Name, a.Holder, a.TTL)
	r.Grant = g
	r.Err, r.Sen = encodeErr(err)
	return nil
}

func (s *memService) Renew(g leasecore.Grant, r *GrantReply) error {
	got, err := s.h.leases.Renew(context.Background(), g)
	r.Grant = got
	r.Err, r.Sen = encodeErr(err)
	return nil
}

func (s *memService) Release(g leasecore.Grant, r *GrantReply) error {
	r.Err, r.Sen = encodeErr(s.h.leases.Release(context.Background(), g))
	return nil
}

func (s *memService) Write(a WriteArgs, r *ResultReply) error {
	res, err := s.h.holderResource(context.Background(), a.Kind)
	if err == nil {
		r.Result, err = res.Write(context.Background(), a.W)
	}
	r.Err, r.Sen = encodeErr(err)
	return nil
}

func (s *memService) Prepare(a WriteArgs, r *ResultReply) error {
	res, err := s.h.holderResource(context.Background(), a.Kind)
	if err == nil {
		p, ok := res.(conformance.Preparer)
		if !ok {
			return fmt.Errorf("resource kind %q has no Prepare", a.Kind)
		}
		r.Result, err = p.Prepare(context.Background(), a.W)
	}
	r.Err, r.Sen = encodeErr(err)
	return nil
}

// The holder side: proxies of the lease and the resource.

type rpcLease struct {
	cl *rpc.Client
	// dropAfter, when set, fails every renewal once it is true.
	dropAfter *atomic.Bool
}

func (l rpcLease) call(method string, args any) (leasecore.Grant, error) {
	if method == "Renew" && l.dropAfter != nil && l.dropAfter.Load() {
		return leasecore.Grant{}, fmt.Errorf("%w: connection dropped (doctored holder)", leasecore.ErrUnavailable)
	}
	start := time.Now() // before the request, as a backend reads Grant.Start
	var r GrantReply
	if err := l.cl.Call("Mem."+method, args, &r); err != nil {
		return leasecore.Grant{}, fmt.Errorf("%w: %v", leasecore.ErrUnavailable, err)
	}
	r.Grant.Start = start
	return r.Grant, decodeErr(r.Err, r.Sen)
}

func (l rpcLease) Acquire(_ context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	return l.call("Acquire", AcquireArgs{name, holder, ttl})
}

func (l rpcLease) Renew(_ context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	return l.call("Renew", g)
}

func (l rpcLease) Release(_ context.Context, g leasecore.Grant) error {
	_, err := l.call("Release", g)
	return err
}

type rpcResource struct {
	cl    *rpc.Client
	kind  conformance.ResourceKind
	wrote *atomic.Bool // set by the first Write
}

func (r rpcResource) call(method string, w leasecore.Write) (leasecore.Result, error) {
	if method == "Write" {
		defer r.wrote.Store(true)
	}
	var rep ResultReply
	if err := r.cl.Call("Mem."+method, WriteArgs{r.kind, w}, &rep); err != nil {
		return leasecore.Result{}, fmt.Errorf("%w: %v", leasecore.ErrUnavailable, err)
	}
	return rep.Result, decodeErr(rep.Err, rep.Sen)
}

// Write is one call: the holder side builds the request, running
// InTransaction while it does (the call is memfence's one atomic
// operation, as an etcd Txn is etcd's), then sends it.
func (r rpcResource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := conformance.InTransaction(ctx, w, func(context.Context) error { return nil }); err != nil {
		return leasecore.Result{}, err
	}
	return r.call("Write", w)
}

// rpcMarkerFirst is the marker-first control: it has Prepare.
type rpcMarkerFirst struct{ rpcResource }

func (r rpcMarkerFirst) Prepare(_ context.Context, w leasecore.Write) (leasecore.Result, error) {
	return r.call("Prepare", w)
}
