package fenceetcd

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// ownKV tells the client's own KV from a wrapper; no server is needed
// (clientv3.New connects lazily).
func TestOwnKV(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if !ownKV(cli) {
		t.Errorf("ownKV of a new client's KV (%T) = false", cli.KV)
	}
	cli.KV = namespace.NewKV(cli.KV, "/tenant-a")
	if ownKV(cli) {
		t.Errorf("ownKV of a namespace KV (%T) = true", cli.KV)
	}
}

// TestPostWaitsForTheSendSlotUnderCtx: a keep-alive whose stream's send
// slot is held — by a Send that gRPC flow control blocks, once a server
// stopped reading — returns at its own ctx, not when the slot frees. With
// thousands of renewals queued behind one blocked Send that wait used to
// last until the server answered again (3 s in an experiment with 10,000
// callers and etcd stopped for 3 s); the experiment needs more goroutines
// than the race detector allows, so this holds the slot by hand.
func TestPostWaitsForTheSendSlotUnderCtx(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	k := newKeepAliver(cli)
	st := &kaStream{ready: make(chan struct{}), exited: make(chan struct{}), sendSlot: make(chan struct{}, 1)}
	close(st.ready)
	k.cur = st
	st.sendSlot <- struct{}{} // a Send in progress that does not return
	const wait = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	c, err := k.post(ctx, 1)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || c != nil || took > wait+50*time.Millisecond {
		t.Fatalf("post with the send slot held: %v, %v after %v; want context.DeadlineExceeded at the %v deadline (+50 ms)", c, err, took, wait)
	}
	if len(st.pending) != 0 {
		t.Fatalf("%d calls queued by a post that gave up", len(st.pending))
	}
}
