package pgconformance

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/leasecore"
)

// AmbiguousLease implements conformance.AmbiguousOutcomes: a lease store on
// a pool of one connection that goes through an answer-dropping proxy on
// 127.0.0.1. Once loseNextAnswer is called, the proxy lets the next request
// reach the server and be carried out, drops the server's answer to the
// statement that ended the transaction (the commit that made the acquire or
// release take effect) and closes the connection, so the driver reports a
// broken connection (leasecore.ErrUnavailable) and cannot tell whether the
// operation happened. The pool dials again on the next call.
func (h *harness) AmbiguousLease(ctx context.Context) (leasecore.Lease, func(), error) {
	target, err := pgconn.ParseConfig(h.cfg.LeaseDSN)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: parse lease DSN: %w", pkg, err)
	}
	p, err := startAnswerDropper(net.JoinHostPort(target.Host, strconv.Itoa(int(target.Port))))
	if err != nil {
		return nil, nil, err
	}
	if !h.onClose(p.close) {
		_ = p.close()
		return nil, nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	dsn, err := withHostPort(h.cfg.LeaseDSN, p.addr())
	if err != nil {
		return nil, nil, err
	}
	// One connection: the request whose answer is dropped is the one the
	// next call sends on the connection that is idle now.
	c, err := h.open(ctx, dsn, 1)
	if err != nil {
		return nil, nil, err
	}
	store, err := c.LeaseStore(h.cfg.leaseOptions()...)
	if err != nil {
		return nil, nil, err
	}
	// Warm up: the first use of each statement may take an extra round trip
	// (a prepare); the answer dropped must be that of the statement that
	// takes effect.
	warm := "ambiguous-warm-up/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	g, err := store.Acquire(ctx, warm, "warm-up", 10*time.Second) // long: a slow machine must not let it lapse
	if err == nil {
		g, err = store.Renew(ctx, g)
	}
	if err == nil {
		err = store.Release(ctx, g)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: warm up the ambiguous lease client: %w", pkg, err)
	}
	return store, p.arm, nil
}

// withHostPort returns dsn (URL or keyword/value form) pointing at addr.
func withHostPort(dsn, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("%s: parse DSN: %w", pkg, err)
		}
		u.Host = addr
		return u.String(), nil
	}
	// Keyword/value: a later keyword overrides an earlier one.
	return dsn + " host=" + host + " port=" + port, nil
}

// answerDropper is a TCP proxy on 127.0.0.1 that forwards PostgreSQL
// frontend/backend protocol connections unchanged until armed. Armed, it
// picks the first connection on which the client then sends, and reads the
// server's messages on it: each group of messages up to a ReadyForQuery is
// forwarded, except the first group that completed a command ('C') and
// left the session idle, outside a transaction ('Z' with status 'I') —
// the answer to the autocommit statement or COMMIT that took effect. That
// group is dropped and both sides of the connection are closed.
type answerDropper struct {
	ln     net.Listener
	target string
	armed  atomic.Bool

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func startAnswerDropper(target string) (*answerDropper, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%s: answer-dropping proxy: %w", pkg, err)
	}
	p := &answerDropper{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *answerDropper) addr() string { return p.ln.Addr().String() }

// arm makes the proxy drop the next answer that ends a transaction.
func (p *answerDropper) arm() { p.armed.Store(true) }

func (p *answerDropper) close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// track registers c for close; false once the proxy is closed.
func (p *answerDropper) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *answerDropper) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client) || !p.track(server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.wg.Add(1)
		go p.serve(client, server)
	}
}

// serve proxies one connection. selected is set by the client-to-server
// copier when the client sends while the proxy is armed; the connection
// was idle then (one connection, used by one call at a time), so the
// server's next byte starts a message.
func (p *answerDropper) serve(client, server net.Conn) {
	defer p.wg.Done()
	var selected atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				if p.armed.CompareAndSwap(true, false) {
					selected.Store(true)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = server.Close()
	}()
	p.serverToClient(client, server, &selected)
	_ = client.Close()
	_ = server.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// serverToClient copies the server's messages to the client, one by one
// until the connection is selected, then in groups up to each
// ReadyForQuery. The client-to-server copier selects the connection before
// it forwards the request, so the first message of the answer is always
// read after the selection.
func (p *answerDropper) serverToClient(client, server net.Conn, selected *atomic.Bool) {
	br := bufio.NewReaderSize(server, 32<<10)
	// The answer to an SSLRequest is one byte, not a message: 'N' (go on in
	// plain text; a NoticeResponse is never the first message of a
	// connection) or 'S' (TLS follows, which this proxy cannot read: it
	// copies the rest and never drops an answer on that connection).
	switch b, err := br.Peek(1); {
	case err != nil:
		return
	case b[0] == 'N':
		if _, err := br.ReadByte(); err != nil {
			return
		}
		if _, err := client.Write(b[:1]); err != nil {
			return
		}
	case b[0] == 'S':
		_, _ = io.Copy(client, br)
		return
	}
	var group []byte
	completed := false
	for {
		typ, msg, err := readMessage(br)
		if err != nil {
			return
		}
		if !selected.Load() {
			if _, err := client.Write(msg); err != nil {
				return
			}
			continue
		}
		group = append(group, msg...)
		if typ == 'C' {
			completed = true
		}
		if typ != 'Z' {
			continue
		}
		if completed && msg[len(msg)-1] == 'I' {
			return // the answer that took effect: dropped, the connection closed
		}
		if _, err := client.Write(group); err != nil {
			return
		}
		group, completed = group[:0], false
	}
}

// readMessage reads one backend message: a type byte and an int32 length
// that counts itself and the body. It returns the whole message.
func readMessage(r io.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n < 4 || n > 1<<30 {
		return 0, nil, fmt.Errorf("%s: answer-dropping proxy: bad message length %d", pkg, n)
	}
	msg := make([]byte, 5+int(n)-4)
	copy(msg, head[:])
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return 0, nil, err
	}
	return head[0], msg, nil
}
