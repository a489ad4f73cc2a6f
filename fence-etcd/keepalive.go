package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keepAliver sends one keep-alive at a time per call, as KeepAliveOnce
// does, but on one long-lived LeaseKeepAlive stream per store instead of a
// stream per keep-alive. etcd has no unary keep-alive: clientv3's
// KeepAliveOnce opens a gRPC stream, sends one request, reads one answer
// and closes it, and the stream's set-up costs the server (and the client)
// about as much as the renewal itself. Measured on this project's machine
// class, 16 concurrent callers on one member: KeepAliveOnce 22,000–27,000/s,
// the same keep-alives on open streams 74,000–83,000/s (docs/capacity.md).
//
// The server answers a stream's requests one at a time, in the order they
// were sent (etcd's LeaseServer.leaseKeepAlive loop: receive, renew, send),
// so the answers are matched to the calls in send order; an answer whose
// lease ID is not the oldest call's is a protocol error that breaks the
// stream. Each call waits for its own answer or its own ctx; a call whose
// caller left still has its answer read and dropped, so the next answer
// goes to the next call.
//
// A stream lives while it is used: it closes after idleStream with no
// keep-alive sent and nothing in flight, and at Close, so an idle store
// leaves no goroutine running. A broken stream (server restarted,
// connection lost, leader lost) fails the calls in flight with its error;
// a call that failed with Unavailable or Internal (the errors KeepAliveOnce
// retries) is sent again on a new stream until its ctx ends, as
// KeepAliveOnce does.
type keepAliver struct {
	cli *clientv3.Client

	mu     sync.Mutex
	cur    *kaStream // the open (or opening) stream, nil when none
	closed bool
}

// idleStream is how long an unused keep-alive stream stays open.
const idleStream = 30 * time.Second

// openTimeout bounds the opening of a stream (the connection may be down);
// the callers waiting for it stop at their own ctx in any case.
const openTimeout = 10 * time.Second

// retryPause spaces the resends of a keep-alive whose stream broke.
const retryPause = 20 * time.Millisecond

// errKeepAlivesClosed is the error of a keep-alive after Close.
var errKeepAlivesClosed = errors.New("keep-alive stream closed")

// errRetired ends a stream that answered with a new raft term; a call
// that finds it so is sent again on a new stream (it is Unavailable).
var errRetired = status.Error(codes.Unavailable, "keep-alive stream retired after a new raft term")

// statusTimeout bounds the leader lookup before a stream opens.
const statusTimeout = 2 * time.Second

type leaderConn struct {
	conn *grpc.ClientConn
	term uint64
}

// leaderConn returns a new connection to the leader among the client's
// endpoints, for a keep-alive stream, when the client has several: a
// leader renews a lease itself, with no raft round, while a follower
// forwards every renewal to the leader over its peer connection (etcd's
// LeaseRenew), which costs the follower and the leader more than the
// renewal. Measured on a 3-member loopback cluster, 16 callers: 66,000
// keep-alives/s on streams to the leader, 10,000/s to a follower. ok is
// false with one endpoint (its member leads, or forwards anyway), or when
// no endpoint names a leader that is one of the endpoints; the stream then
// goes on the client's own connection, as before.
//
// It asks every endpoint's Status at once and takes the first answer of a
// member that says it leads: a member that answers slowly or not at all
// (stopped, overloaded, cut off) delays the stream only when no other
// answer names the leader, and then by statusTimeout at most. Every
// keep-alive of the store waits for its stream, so this wait is theirs.
func (k *keepAliver) leaderConn(ctx context.Context) (leaderConn, bool) {
	eps := k.cli.Endpoints()
	if len(eps) < 2 {
		return leaderConn{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel() // the slower lookups stop here
	type answer struct {
		ep   string
		lead bool
		term uint64
	}
	answers := make(chan answer, len(eps)) // buffered: no lookup waits for a reader that left
	for _, ep := range eps {
		go func() {
			resp, err := k.cli.Status(ctx, ep)
			a := answer{ep: ep}
			if err == nil && resp.Header != nil && resp.Header.MemberId != 0 {
				a.lead, a.term = resp.Header.MemberId == resp.Leader, resp.RaftTerm
			}
			answers <- a
		}()
	}
	for range eps {
		a := <-answers
		if !a.lead {
			continue
		}
		conn, err := k.cli.Dial(a.ep)
		if err != nil {
			return leaderConn{}, false
		}
		return leaderConn{conn: conn, term: a.term}, true
	}
	return leaderConn{}, false
}

type kaStream struct {
	ctx    context.Context // the stream's: cancelled when it breaks
	cancel context.CancelFunc
	ready  chan struct{} // closed when opened or failed to open
	exited chan struct{} // closed when its goroutine returns

	// Set before ready is closed, then read-only.
	stream  etcdserverpb.Lease_LeaseKeepAliveClient
	openErr error

	// Set before ready is closed, then read-only: the connection the
	// stream was opened on when the store dialed the leader for it (closed
	// with the stream), and the leader's raft term then.
	ownConn  *grpc.ClientConn
	leaderKV clientv3.KV // reads on ownConn; nil without it
	term     uint64

	sendSlot chan struct{} // one slot: its holder sends; the queue order is the send order

	mu      sync.Mutex
	pending []*kaCall // sent, unanswered, oldest first
	broken  error     // set once; then pending is empty and nothing is queued
	used    bool      // a keep-alive was sent since the idle timer last fired
	idle    *time.Timer
}

type kaCall struct {
	id   int64
	done chan error // buffered: an answer never waits for a caller that left
}

func newKeepAliver(cli *clientv3.Client) *keepAliver {
	return &keepAliver{cli: cli}
}

// keepAlive keeps etcd lease id alive once, on the store's keep-alive
// stream: nil, or rpctypes.ErrLeaseNotFound when the lease is gone, or
// another error, as clientv3's KeepAliveOnce. After Close, which ends the
// stream, it is KeepAliveOnce itself: Renew and RenewAll keep working after
// Close (see Close), at the cost of a stream per keep-alive.
func (s *LeaseStore) keepAlive(ctx context.Context, id clientv3.LeaseID) error {
	return s.keepAliveFinish(ctx, s.keepAliveBegin(ctx, id))
}

// keepAliveBegin sends a keep-alive of id and returns without its answer,
// which keepAliveFinish waits for: RenewAll's fast path sends it before
// its read, so that the two requests overlap.
func (s *LeaseStore) keepAliveBegin(ctx context.Context, id clientv3.LeaseID) sentKeepAlive {
	c, err := s.ka.post(ctx, id)
	return sentKeepAlive{id: id, call: c, err: err}
}

// keepAliveFinish returns the answer of a keep-alive keepAliveBegin sent,
// as keepAlive's; one that failed is sent again as keepAlive would.
func (s *LeaseStore) keepAliveFinish(ctx context.Context, p sentKeepAlive) error {
	err := p.err
	if err == nil {
		err = s.ka.await(ctx, p.call)
	}
	err = s.ka.retry(ctx, p.id, err)
	if errors.Is(err, errKeepAlivesClosed) {
		_, err = s.leases.KeepAliveOnce(ctx, p.id)
	}
	return err
}

// sentKeepAlive is a keep-alive sent (call), or that could not be (err).
type sentKeepAlive struct {
	id   clientv3.LeaseID
	call *kaCall
	err  error
}

// retry returns the final answer of a keep-alive of id whose answer was
// err: nil when the lease exists (its TTL restarted),
// rpctypes.ErrLeaseNotFound when it does not, the ctx's error when ctx
// ended first, or the server's error. Unavailable and Internal errors are
// retried on a new stream until ctx ends, as KeepAliveOnce does, and an
// expired auth token once.
func (k *keepAliver) retry(ctx context.Context, id clientv3.LeaseID, err error) error {
	authRetried := false
	for {
		switch {
		case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, errKeepAlivesClosed):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.Internal:
		case codes.Unauthenticated:
			// The stream's auth token expired: a new stream
			// authenticates again (clientv3's stream interceptor).
			if authRetried {
				return rpctypes.Error(err)
			}
			authRetried = true
		default:
			return rpctypes.Error(err)
		}
		select {
		case <-time.After(retryPause):
		case <-ctx.Done():
			return ctx.Err()
		}
		c, perr := k.post(ctx, id)
		if err = perr; err == nil {
			err = k.await(ctx, c)
		}
	}
}

// post sends one keep-alive on the current stream, opening one if needed.
func (k *keepAliver) post(ctx context.Context, id clientv3.LeaseID) (*kaCall, error) {
	st, err := k.stream(ctx)
	if err != nil {
		return nil, err
	}
	c := &kaCall{id: int64(id), done: make(chan error, 1)}
	// The send slot, waited for under ctx: a Send blocked by gRPC flow
	// control (a server that stopped reading) holds it, and thousands of
	// callers queued behind it must still return at their deadlines.
	select {
	case st.sendSlot <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-st.sendSlot }()
	if err := ctx.Err(); err != nil { // select picks at random when both are ready
		return nil, err
	}
	st.mu.Lock()
	if st.broken != nil {
		err := st.broken
		st.mu.Unlock()
		return nil, err
	}
	st.pending = append(st.pending, c)
	st.used = true
	st.mu.Unlock()
	// Should this Send block until ctx ends, the stream breaks: its calls
	// in flight get Unavailable and are sent again on a new stream (this
	// one's caller has left by then), and the Send returns.
	stop := context.AfterFunc(ctx, func() {
		k.breakStream(st, status.Error(codes.Unavailable, "keep-alive send blocked past a caller's deadline"))
	})
	// A failed Send needs nothing more: it means the stream ended (io.EOF
	// when the server ended it), and the receiver, whose Recv returns
	// the stream's real status, answers every call in flight with it.
	_ = st.stream.Send(&etcdserverpb.LeaseKeepAliveRequest{ID: int64(id)})
	stop()
	return c, nil
}

// await waits for c's answer or ctx.
func (k *keepAliver) await(ctx context.Context, c *kaCall) error {
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leaderKV returns a KV on the current stream's connection to the leader,
// when there is one: RenewAll's fast path sends its generation-key reads
// there too (see genReader). The connection closes with its stream, so a
// read on it may fail with it; the caller then reads through the client.
func (k *keepAliver) leaderKV() (clientv3.KV, bool) {
	k.mu.Lock()
	st := k.cur
	k.mu.Unlock()
	if st == nil {
		return nil, false
	}
	select {
	case <-st.ready:
	default:
		return nil, false
	}
	if st.openErr != nil || st.leaderKV == nil {
		return nil, false
	}
	return st.leaderKV, true
}

// openLeaderKV is leaderKV after opening a stream when there is none
// (bounded by ctx): a read that failed on the connection of a stream that
// ended — retired after a new term, its connection closed under the read
// — goes to the new leader, where the keep-alives go, not through the
// client's balancer, which may pick a member that no longer answers.
func (k *keepAliver) openLeaderKV(ctx context.Context) (clientv3.KV, bool) {
	st, err := k.stream(ctx)
	if err != nil || st.leaderKV == nil {
		return nil, false
	}
	return st.leaderKV, true
}

// stream returns the open stream, opening one when there is none.
func (k *keepAliver) stream(ctx context.Context) (*kaStream, error) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, errKeepAlivesClosed
	}
	st := k.cur
	if st == nil {
		// The stream ends with the client too: a store whose client
		// was closed without the store's Close leaves nothing running.
		sctx, cancel := context.WithCancel(k.cli.Ctx())
		st = &kaStream{ctx: sctx, cancel: cancel, ready: make(chan struct{}), exited: make(chan struct{}), sendSlot: make(chan struct{}, 1)}
		k.cur = st
		go k.run(st)
	}
	k.mu.Unlock()
	select {
	case <-st.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if st.openErr != nil {
		return nil, st.openErr
	}
	return st, nil
}

// run opens st and reads its answers until it breaks or idles out.
func (k *keepAliver) run(st *kaStream) {
	defer close(st.exited)
	defer func() {
		if st.ownConn != nil {
			_ = st.ownConn.Close()
		}
	}()
	watchdog := time.AfterFunc(openTimeout, st.cancel)
	conn := k.cli.ActiveConnection()
	if leader, ok := k.leaderConn(st.ctx); ok {
		conn, st.term = leader.conn, leader.term
		st.ownConn = leader.conn
		st.leaderKV = clientv3.NewKVFromKVClient(etcdserverpb.NewKVClient(leader.conn), k.cli)
	}
	stream, err := etcdserverpb.NewLeaseClient(conn).LeaseKeepAlive(st.ctx, grpc.WaitForReady(true))
	watchdog.Stop()
	if err == nil && st.ctx.Err() != nil {
		err = status.Error(codes.Unavailable, "opening the keep-alive stream timed out")
	}
	if err != nil {
		st.cancel()
		st.openErr = err
		k.mu.Lock()
		if k.cur == st {
			k.cur = nil
		}
		k.mu.Unlock()
		close(st.ready)
		return
	}
	st.stream = stream
	st.mu.Lock()
	st.idle = time.AfterFunc(idleStream, func() { k.idleCheck(st) })
	st.mu.Unlock()
	close(st.ready)

	for {
		resp, err := stream.Recv()
		if err != nil {
			k.breakStream(st, err)
			return
		}
		st.mu.Lock()
		if len(st.pending) == 0 || st.pending[0].id != resp.ID {
			st.mu.Unlock()
			k.breakStream(st, status.Error(codes.Internal,
				fmt.Sprintf("keep-alive answer for lease %x out of order", resp.ID)))
			return
		}
		c := st.pending[0]
		st.pending[0] = nil
		st.pending = st.pending[1:]
		st.mu.Unlock()
		if resp.TTL <= 0 {
			c.done <- rpctypes.ErrLeaseNotFound
		} else {
			c.done <- nil
		}
		if st.term != 0 && resp.Header.GetRaftTerm() > st.term {
			// A new term: the member the stream was opened on may no
			// longer lead (a follower forwards each renewal to the
			// leader, and a read there waits for a read index from it,
			// which stalls while the leadership moves: seen 0.5-1.3 s).
			// The stream ends now, its connection with it: the calls
			// in flight are sent again on a new stream, to the leader
			// found then (errRetired is Unavailable), and the reads in
			// flight on the connection fail and go there too (see
			// genReader.reopen).
			k.breakStream(st, errRetired)
			return
		}
	}
}

// idleCheck closes st when it was not used since the last check and has
// nothing in flight; otherwise it checks again after idleStream.
func (k *keepAliver) idleCheck(st *kaStream) {
	st.mu.Lock()
	if st.broken != nil {
		st.mu.Unlock()
		return
	}
	if st.used || len(st.pending) > 0 {
		st.used = false
		st.idle.Reset(idleStream)
		st.mu.Unlock()
		return
	}
	st.mu.Unlock()
	k.breakStream(st, status.Error(codes.Unavailable, "keep-alive stream closed after idling"))
}

// breakStream ends st: it is no longer the current stream, its calls in
// flight get err, and its goroutine returns.
func (k *keepAliver) breakStream(st *kaStream, err error) {
	k.mu.Lock()
	if k.cur == st {
		k.cur = nil
	}
	k.mu.Unlock()
	st.mu.Lock()
	if st.broken != nil {
		st.mu.Unlock()
		return
	}
	st.broken = err
	pending := st.pending
	st.pending = nil
	if st.idle != nil {
		st.idle.Stop()
	}
	st.mu.Unlock()
	st.cancel()
	for _, c := range pending {
		c.done <- err
	}
}

// close ends the current stream, waits for its goroutine, and refuses
// later keep-alives (errKeepAlivesClosed).
func (k *keepAliver) close() {
	k.mu.Lock()
	k.closed = true
	st := k.cur
	k.mu.Unlock()
	if st == nil {
		return
	}
	k.breakStream(st, errKeepAlivesClosed)
	<-st.exited
}

// ownKV reports whether cli.KV is the KV clientv3.New made (one on the
// client's own connection), not a wrapper the application put in its place.
func ownKV(cli *clientv3.Client) bool {
	return fmt.Sprintf("%T", cli.KV) == fmt.Sprintf("%T", clientv3.NewKVFromKVClient(nil, nil))
}
