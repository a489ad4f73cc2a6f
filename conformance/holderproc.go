package conformance

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// holderProc is the parent's handle on one holder process (RunHolder).
type holderProc struct {
	c       *caseRun
	label   string // "A", "B": the timeline lane
	pid     int
	stdin   io.WriteCloser
	replies chan string
	exited  chan error
	stderr  *lockedBuffer
}

// startHolder starts a holder process writing to the resource of kind.
func (c *caseRun) startHolder(hp HolderProcesses, kind ResourceKind, label string) *holderProc {
	cmd, err := hp.HolderCommand(c.ctx, kind)
	c.Must(err, "holder command")
	stdin, err := cmd.StdinPipe()
	c.Must(err, "holder stdin")
	stdout, err := cmd.StdoutPipe()
	c.Must(err, "holder stdout")
	p := &holderProc{c: c, label: label, stdin: stdin, replies: make(chan string, 64),
		exited: make(chan error, 1), stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	c.Must(cmd.Start(), "start holder process "+label)
	p.pid = cmd.Process.Pid
	c.record(label, fmt.Sprintf("process %s started (pid %d)", label, p.pid))
	c.cleanup(func() {
		// Whatever happened, leave no process behind, stopped or not.
		_ = thaw(p.pid)
		_ = cmd.Process.Kill()
		<-p.exited
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if ev, ok := strings.CutPrefix(line, "EVENT "); ok {
				c.record(label, ev)
				continue
			}
			p.replies <- line
		}
		close(p.replies)
		p.exited <- cmd.Wait()
	}()
	return p
}

// send writes one command line.
func (p *holderProc) send(line string) {
	_, err := io.WriteString(p.stdin, line+"\n")
	p.c.Must(err, fmt.Sprintf("send %q to holder %s", line, p.label))
}

// reply waits for the next reply line, ending the case on timeout, exit or
// an ERROR reply.
func (p *holderProc) reply(what string) string {
	timeout := 30*time.Second + 10*p.c.traits.MinTTL
	select {
	case line, ok := <-p.replies:
		if !ok {
			p.c.Fatalf("holder %s exited while %s; stderr: %s", p.label, what, p.stderr.String())
		}
		if strings.HasPrefix(line, "ERROR ") {
			p.c.Fatalf("holder %s, %s: %s", p.label, what, line)
		}
		p.c.record(p.label, line)
		return line
	case <-time.After(timeout):
		p.c.Fatalf("holder %s gave no reply within %v while %s; stderr: %s", p.label, timeout, what, p.stderr.String())
	case <-p.c.ctx.Done():
		p.c.Fatalf("holder %s, %s: %v", p.label, what, p.c.ctx.Err())
	}
	return ""
}

// call sends a command and returns its reply.
func (p *holderProc) call(line string) string {
	p.send(line)
	return p.reply(line)
}

// exit asks the holder to exit and waits for it.
func (p *holderProc) exit() error {
	p.send("EXIT")
	for range p.replies {
	}
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("holder %s did not exit", p.label)
	}
}

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.b.String())
}
