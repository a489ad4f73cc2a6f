package fenceetcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestRenewAllFastReadsBatched: concurrent fast-path RenewAll calls of many
// holders on one store read their generation keys together. While the first
// read is held back, the other holders' reads queue and go in one read-only
// transaction; each holder gets its own answer — one holder whose name was
// released through another store meanwhile falls back to the full check and
// loses only that name, the others stay on the fast path.
func TestRenewAllFastReadsBatched(t *testing.T) {
	f := newFixture(t)
	var (
		holdFirst atomic.Bool
		mu        sync.Mutex
		genReads  []int // the generation keys each request read
	)
	release := make(chan struct{})
	cli := dialWith(t, etcdtest.Server(t).Endpoints(),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			n := 0
			switch r := req.(type) {
			case *etcdserverpb.RangeRequest:
				if strings.Contains(string(r.Key), "/holdergen/") {
					n = 1
				}
			case *etcdserverpb.TxnRequest:
				for _, op := range r.Success {
					if rr := op.GetRequestRange(); rr != nil && strings.Contains(string(rr.Key), "/holdergen/") && len(r.Compare) == 0 {
						n++
					}
				}
			}
			if n > 0 {
				mu.Lock()
				genReads = append(genReads, n)
				mu.Unlock()
				if holdFirst.CompareAndSwap(true, false) {
					<-release
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
	)
	s := sharedStore(t, f, cli)
	defer s.Close()
	other, err := fenceetcd.NewLeaseStore(f.cli, fenceetcd.WithPrefix(f.prefix), fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	const holders = 40
	gs := make([][]leasecore.Grant, holders)
	for h := range gs {
		gs[h] = acquireN(t, s, fmt.Sprintf("h%d", h), fmt.Sprintf("holder-%d", h), 3, time.Minute)
		// The first RenewAll runs the full check; the next ones are fast.
		if _, _, err := s.RenewAll(context.Background(), gs[h]); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	genReads = nil
	mu.Unlock()
	// Holder 7's second name is released through another store: its
	// generation key changes, so its fast read must miss.
	if err := other.Release(context.Background(), gs[7][1]); err != nil {
		t.Fatal(err)
	}

	holdFirst.Store(true)
	type result struct {
		renewed []leasecore.Grant
		lost    []error
		err     error
	}
	results := make([]result, holders)
	var wg sync.WaitGroup
	wg.Go(func() {
		r := &results[0]
		r.renewed, r.lost, r.err = s.RenewAll(context.Background(), gs[0])
	})
	for !func() bool { mu.Lock(); defer mu.Unlock(); return len(genReads) == 1 }() {
		time.Sleep(time.Millisecond) // the first read is being held
	}
	for h := 1; h < holders; h++ {
		wg.Go(func() {
			r := &results[h]
			r.renewed, r.lost, r.err = s.RenewAll(context.Background(), gs[h])
		})
	}
	time.Sleep(200 * time.Millisecond) // let every other read queue
	close(release)
	wg.Wait()

	for h, r := range results {
		if r.err != nil {
			t.Fatalf("holder %d: %v", h, r.err)
		}
		for i := range gs[h] {
			wantLost := h == 7 && i == 1
			if got := r.lost[i] != nil; got != wantLost {
				t.Errorf("holder %d name %d: lost %v, want lost=%v", h, i, r.lost[i], wantLost)
			}
			if !wantLost && r.renewed[i].Token != gs[h][i].Token {
				t.Errorf("holder %d name %d: renewed %+v", h, i, r.renewed[i])
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// The held read (1 key), then the others in one transaction (39 keys);
	// holder 7's full check reads its generation key again, guarded.
	if len(genReads) < 2 || genReads[0] != 1 || genReads[1] != holders-1 {
		t.Errorf("generation-key reads per request: %v, want [1 %d ...]", genReads, holders-1)
	}
}
