package torture

import (
	"errors"
	"io"
	"net"
	"sync"
)

// proxy forwards one holder's TCP connections to the server, on
// 127.0.0.1. The nemesis can hold its traffic: while held, the bytes a
// side sends wait in the proxy (and behind it in the kernel's buffers),
// and on release they are delivered in order, late. Connections are not
// cut, so a request sent while the holder's lease was valid arrives after
// it expired: the network-delayed write.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	open   chan struct{} // closed while traffic flows
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func startProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, open: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// hold stops delivery in both directions until release.
func (p *proxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already held
	}
}

// release delivers what was held and lets traffic flow again.
func (p *proxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// gate returns the channel to wait on before delivering bytes.
func (p *proxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the server for one client connection and pumps both ways.
// A server that is down (crashed) refuses the dial: the client's
// connection is closed, as a refused connection would be.
func (p *proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	var both sync.WaitGroup
	both.Add(2)
	pump := func(dst, src net.Conn) {
		defer both.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				<-p.gate()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// One side is gone: so is the other, as with a real connection
		// through a broken path.
		_ = dst.Close()
		_ = src.Close()
	}
	go pump(server, client)
	go pump(client, server)
	both.Wait()
	p.untrack(client, server)
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// close stops the proxy and every connection through it.
func (p *proxy) close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	select {
	case <-p.open:
	default:
		close(p.open)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

// proxySet is one holder's proxies, one per server address the holder
// reaches: one for PostgreSQL and a single etcd, one per member of an etcd
// cluster (the holder's client gets all of them as its endpoints, so it
// survives the loss of any one member). The delay fault holds them all.
type proxySet []*proxy

func startProxies(targets []string) (proxySet, error) {
	var ps proxySet
	for _, t := range targets {
		p, err := startProxy(t)
		if err != nil {
			_ = ps.close()
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func (ps proxySet) addrs() []string {
	as := make([]string, len(ps))
	for i, p := range ps {
		as[i] = p.addr()
	}
	return as
}

func (ps proxySet) hold() {
	for _, p := range ps {
		p.hold()
	}
}

func (ps proxySet) release() {
	for _, p := range ps {
		p.release()
	}
}

func (ps proxySet) close() error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.close())
	}
	return errors.Join(errs...)
}
