package torture

import (
	"io"
	"net"
	"testing"
	"time"
)

// The proxy holds bytes while held and delivers them, in order, on
// release, without cutting the connection.
func TestProxyHoldsThenDelivers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	p, err := startProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string, within time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(within))
		buf := make([]byte, len(msg))
		n, err := io.ReadFull(c, buf)
		return string(buf[:n]), err
	}
	if got, err := echo("one", 2*time.Second); err != nil || got != "one" {
		t.Fatalf("before the hold: %q, %v", got, err)
	}
	p.hold()
	if got, err := echo("two", 200*time.Millisecond); err == nil {
		t.Fatalf("while held, the echo came back: %q", got)
	}
	p.release()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "two" {
		t.Fatalf("after the release: %q, %v", buf, err)
	}
}
