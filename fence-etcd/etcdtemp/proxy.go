package etcdtemp

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

const (
	// identifyTimeout bounds the wait for a new connection's first request. etcd's peer
	// transport writes its request as soon as it has connected.
	identifyTimeout = 10 * time.Second
	// proxyDialTimeout bounds the connection to the member's own peer listener, on loopback:
	// it is refused at once while the member is down.
	proxyDialTimeout = 5 * time.Second
)

// peerProxy is the TCP proxy in front of one Cluster member's peer listener. Its URL is the
// peer URL the member announces, so every connection another member opens to it (raft streams,
// raft pipeline POSTs, snapshots, lease renewals forwarded to the leader, version checks,
// probes) crosses it. It forwards bytes as they are, after reading, not consuming, the first
// request's headers to learn which member opened the connection; Cluster.Partition decides
// what passes.
type peerProxy struct {
	c      *Cluster
	member int
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and one goroutine per connection

	// Guarded by c.netMu.
	target string // the member's own peer listener, host:port
	conns  map[*proxyConn]struct{}
	closed bool
}

// proxyConn is one connection through a proxy. Its fields are guarded by the cluster's netMu.
type proxyConn struct {
	client   net.Conn // from the member that dialed
	upstream net.Conn // to the proxy's member; nil until dialed, and for a held connection

	// decided is set once the first request has been read and the connection either forwarded
	// or held; Partition and Heal leave undecided connections alone, which decide under the
	// state they find.
	decided bool
	fromID  uint64 // the X-Server-From member ID of the first request; 0 without one
	owner   int    // without fromID: the member whose process owns the other end, or -1
	held    bool   // read and discarded, never forwarded nor answered
	closed  bool
}

func newPeerProxy(c *Cluster, member int, host string) (*peerProxy, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: peer proxy of %s on %s: %w", memberNameOf(member), host, err)
	}
	p := &peerProxy{c: c, member: member, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// url is the member's announced peer URL.
func (p *peerProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *peerProxy) setTarget(hostport string) {
	p.c.netMu.Lock()
	defer p.c.netMu.Unlock()
	p.target = hostport
}

func (p *peerProxy) serve() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return // closed by close; Accept on loopback fails for no other reason worth a retry
		}
		pc := &proxyConn{client: conn, owner: -1}
		p.c.netMu.Lock()
		if p.closed {
			p.c.netMu.Unlock()
			conn.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.c.netMu.Unlock()
		p.wg.Add(1)
		go p.handle(pc)
	}
}

// handle identifies the connection, then holds or forwards it until either side closes it or
// the cluster cuts it.
func (p *peerProxy) handle(pc *proxyConn) {
	defer p.wg.Done()
	defer p.drop(pc)
	head, fromID, err := readFirstRequest(pc.client)
	if err != nil {
		return
	}
	owner := -1
	if fromID == 0 {
		owner = socketOwner(pc.client, p.c.memberPIDs())
	}

	c := p.c
	c.netMu.Lock()
	if pc.closed {
		c.netMu.Unlock()
		return
	}
	pc.fromID, pc.owner, pc.decided = fromID, owner, true
	pc.held = c.blockedLocked(pc.fromLocked(c), p.member)
	target := p.target
	c.netMu.Unlock()

	if pc.held {
		// What a network that drops packets does to the sender: its writes vanish, no answer
		// comes, until its own timeout gives up or Heal closes the connection.
		_, _ = io.Copy(io.Discard, pc.client)
		return
	}
	up, err := net.DialTimeout("tcp", target, proxyDialTimeout)
	if err != nil {
		return // the member is down: the dialer sees its connection closed
	}
	c.netMu.Lock()
	if pc.closed { // cut by Partition, or Stop, while dialing
		c.netMu.Unlock()
		up.Close()
		return
	}
	pc.upstream = up
	c.netMu.Unlock()

	if _, err := up.Write(head); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, pc.client)
		p.closeConn(pc)
	}()
	_, _ = io.Copy(pc.client, up)
	p.closeConn(pc)
	<-done
}

// readFirstRequest reads the headers of the connection's first HTTP request and returns every
// byte read from conn so far, to be forwarded as is, and the sender's member ID from
// X-Server-From, 0 when the request has none. The body is not parsed: whatever part of it was
// read ahead is in head.
//
// etcd's raft transport (go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp) sets
// X-Server-From to its own member ID in hex on every request it makes: the stream GETs
// (streamReader.dial) and the pipeline and snapshot POSTs (createPostRequest). A connection
// belongs to one process's HTTP transport, so its later requests come from the same member.
func readFirstRequest(conn net.Conn) (head []byte, fromID uint64, err error) {
	if err := conn.SetReadDeadline(time.Now().Add(identifyTimeout)); err != nil {
		return nil, 0, err
	}
	var rec bytes.Buffer
	req, err := http.ReadRequest(bufio.NewReader(io.TeeReader(conn, &rec)))
	if err != nil {
		return nil, 0, err
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return nil, 0, err
	}
	if v := req.Header.Get("X-Server-From"); v != "" {
		if id, err := strconv.ParseUint(v, 16, 64); err == nil {
			fromID = id
		}
	}
	return rec.Bytes(), fromID, nil
}

// fromLocked is the member that opened the connection, or -1.
func (pc *proxyConn) fromLocked(c *Cluster) int {
	if pc.fromID != 0 {
		return c.memberByIDLocked(pc.fromID)
	}
	return pc.owner
}

func (pc *proxyConn) closeLocked() {
	if pc.closed {
		return
	}
	pc.closed = true
	pc.client.Close()
	if pc.upstream != nil {
		pc.upstream.Close()
	}
}

func (p *peerProxy) closeConn(pc *proxyConn) {
	p.c.netMu.Lock()
	defer p.c.netMu.Unlock()
	pc.closeLocked()
}

func (p *peerProxy) drop(pc *proxyConn) {
	p.c.netMu.Lock()
	defer p.c.netMu.Unlock()
	pc.closeLocked()
	delete(p.conns, pc)
}

// cutLocked closes the forwarded connections the partition state now blocks and returns how
// many. c.netMu is held.
func (p *peerProxy) cutLocked() int {
	n := 0
	for pc := range p.conns {
		if pc.decided && !pc.held && !pc.closed && p.c.blockedLocked(pc.fromLocked(p.c), p.member) {
			pc.closeLocked()
			n++
		}
	}
	return n
}

// releaseLocked closes the held connections the partition state no longer blocks, so their
// senders dial again and get through, and returns how many. c.netMu is held.
func (p *peerProxy) releaseLocked() int {
	n := 0
	for pc := range p.conns {
		if pc.held && !pc.closed && !p.c.blockedLocked(pc.fromLocked(p.c), p.member) {
			pc.closeLocked()
			n++
		}
	}
	return n
}

// close stops accepting, closes every connection, and waits for the proxy's goroutines.
func (p *peerProxy) close() {
	p.c.netMu.Lock()
	p.closed = true
	p.ln.Close()
	for pc := range p.conns {
		pc.closeLocked()
	}
	p.c.netMu.Unlock()
	p.wg.Wait()
}
