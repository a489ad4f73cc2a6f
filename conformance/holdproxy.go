package conformance

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// holdProxy is a TCP proxy on 127.0.0.1 in front of one upstream address
// (F14). It forwards both directions unchanged until hold: from then on
// what clients send is read and kept, in order, instead of being forwarded
// — the request has left the client and sits in the network — while what
// the server sends still flows. deliver writes the kept bytes upstream, in
// the order they arrived, and forwarding goes on.
//
// Each connection has three goroutines: one reads the client into the
// connection's queue, one writes the queue to the server (it waits while
// the proxy holds), one copies the server to the client. Half-closes are
// forwarded: a client's EOF reaches the server (CloseWrite) after every byte
// queued before it, held ones included; the server's EOF reaches the
// client. Any other error, or both directions done, closes both sockets.
// close stops the listener and every connection and returns once every
// goroutine of the proxy has returned.
type holdProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	cond    *sync.Cond // signalled on every change below
	holding bool
	closed  bool
	conns   map[*proxyConn]struct{}
	wg      sync.WaitGroup
}

// proxyConn is one client connection and its upstream connection. Its
// fields are guarded by the proxy's mu.
type proxyConn struct {
	client, server net.Conn
	queue          []byte // read from the client, not yet written to the server
	writing        int    // bytes taken from queue by a write in progress
	eof            bool   // the client closed its write side after queue
	dead           bool   // an error or close ended the connection: queue dropped
	finished       int    // how many of its three goroutines have returned
}

// startHoldProxy listens on 127.0.0.1 (a port of the system's choice) and
// forwards each connection to upstream.
func startHoldProxy(upstream string) (*holdProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("conformance: hold proxy: %w", err)
	}
	p := &holdProxy{ln: ln, upstream: upstream, conns: map[*proxyConn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// addr is the address clients connect to.
func (p *holdProxy) addr() string { return p.ln.Addr().String() }

// hold stops forwarding client to server; what arrives is kept.
func (p *holdProxy) hold() {
	p.mu.Lock()
	p.holding = true
	p.mu.Unlock()
}

// held returns the bytes that reached the proxy from clients and have not
// been written to the server: while holding, the bytes held.
func (p *holdProxy) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for pc := range p.conns {
		n += len(pc.queue) + pc.writing
	}
	return n
}

// deliver ends the hold: the kept bytes are written to the server in the
// order they arrived, and forwarding goes on. It returns how many bytes
// were kept, once the server's side has accepted every one of them (or
// their connection ended, or the proxy was closed).
func (p *holdProxy) deliver() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding = false
	n := 0
	for pc := range p.conns {
		n += len(pc.queue) + pc.writing
	}
	p.cond.Broadcast()
	for !p.closed && p.pendingLocked() {
		p.cond.Wait()
	}
	return n
}

// pendingLocked reports whether a live connection still has bytes for the
// server.
func (p *holdProxy) pendingLocked() bool {
	for pc := range p.conns {
		if !pc.dead && len(pc.queue)+pc.writing > 0 {
			return true
		}
	}
	return false
}

// close stops the proxy: the listener and every connection are closed, held
// bytes are dropped, and it returns when every goroutine has returned.
func (p *holdProxy) close() error {
	p.mu.Lock()
	p.closed = true
	for pc := range p.conns {
		pc.dead = true
		_ = pc.client.Close()
		_ = pc.server.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed (a proxy on loopback has no other Accept error worth retrying)
		}
		server, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
		if err != nil {
			_ = client.Close() // the client sees the connection refused, as without the proxy
			continue
		}
		pc := &proxyConn{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(3)
		p.mu.Unlock()
		go p.readClient(pc)
		go p.writeServer(pc)
		go p.copyServer(pc)
	}
}

// failLocked ends pc after an error: both sockets closed, its queue dropped.
func (p *holdProxy) failLocked(pc *proxyConn) {
	if !pc.dead {
		pc.dead = true
		_ = pc.client.Close()
		_ = pc.server.Close()
	}
	p.cond.Broadcast()
}

// readClient reads what the client sends into pc's queue, holding or not:
// bytes in the queue have left the client.
func (p *holdProxy) readClient(pc *proxyConn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		p.mu.Lock()
		if n > 0 && !pc.dead {
			pc.queue = append(pc.queue, buf[:n]...)
			p.cond.Broadcast()
		}
		switch {
		case err == nil:
			p.mu.Unlock()
			continue
		case errors.Is(err, io.EOF):
			pc.eof = true // forwarded after the queue
			p.cond.Broadcast()
		default:
			p.failLocked(pc)
		}
		p.mu.Unlock()
		p.finish(pc)
		return
	}
}

// writeServer writes pc's queue to the server, except while the proxy
// holds; after the client's EOF and the last queued byte it half-closes the
// server's side.
func (p *holdProxy) writeServer(pc *proxyConn) {
	defer p.wg.Done()
	p.mu.Lock()
	for {
		// Go on when the connection ended, or when not holding and there
		// is something to pass on: bytes, or the client's EOF after them.
		for !pc.dead && (p.holding || (len(pc.queue) == 0 && !pc.eof)) {
			p.cond.Wait()
		}
		if pc.dead {
			break
		}
		if len(pc.queue) == 0 { // the client's EOF, every byte before it written
			p.mu.Unlock()
			err := closeWrite(pc.server)
			p.mu.Lock()
			if err != nil {
				p.failLocked(pc)
			}
			break
		}
		chunk := pc.queue
		pc.queue, pc.writing = nil, len(chunk)
		p.mu.Unlock()
		_, err := pc.server.Write(chunk) // outside the lock: held() and hold() must not wait for the network
		p.mu.Lock()
		pc.writing = 0
		if err != nil {
			p.failLocked(pc)
			break
		}
		p.cond.Broadcast() // deliver waits for the queue to empty
	}
	p.mu.Unlock()
	p.finish(pc)
}

// copyServer copies the server to the client, holding or not.
func (p *holdProxy) copyServer(pc *proxyConn) {
	defer p.wg.Done()
	_, err := io.Copy(pc.client, pc.server)
	if err == nil { // the server's EOF: pass it on
		err = closeWrite(pc.client)
	}
	p.mu.Lock()
	if err != nil {
		p.failLocked(pc)
	}
	p.mu.Unlock()
	p.finish(pc)
}

// finish is called by each of pc's three goroutines when it returns; the
// last one closes both sockets and forgets pc.
func (p *holdProxy) finish(pc *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc.finished++
	if pc.finished < 3 {
		return
	}
	_ = pc.client.Close()
	_ = pc.server.Close()
	pc.dead = true
	delete(p.conns, pc)
	p.cond.Broadcast()
}

// closeWrite half-closes c (a *net.TCPConn), or closes it if it cannot.
func closeWrite(c net.Conn) error {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		return tc.CloseWrite()
	}
	return c.Close()
}
