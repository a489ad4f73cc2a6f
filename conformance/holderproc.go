package conformance

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
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
	// renewed carries the start of the holder's latest successful
	// background renewal (its "EVENT RENEWED ok=true ... start=" line);
	// it keeps only the newest one.
	renewed chan time.Time
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
		exited: make(chan error, 1), stderr: &lockedBuffer{}, renewed: make(chan time.Time, 1)}
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
				p.noteRenewal(ev)
				continue
			}
			p.replies <- line
		}
		close(p.replies)
		p.exited <- cmd.Wait()
	}()
	return p
}

// noteRenewal passes the start of a successful renewal reported by ev on
// to p.renewed, replacing an older one nobody took.
func (p *holderProc) noteRenewal(ev string) {
	_, rest, ok := strings.Cut(ev, " start=")
	if !ok || !strings.HasPrefix(ev, "RENEWED ok=true") {
		return
	}
	nanos, err := strconv.ParseInt(rest, 10, 64)
	if err != nil {
		return
	}
	for {
		select {
		case p.renewed <- time.Unix(0, nanos):
			return
		default:
			select {
			case <-p.renewed:
			default:
			}
		}
	}
}

// freezeBetweenRenewals freezes the holder with SIGSTOP right after one of
// its background renewals answered and before its next one starts (renew
// after the answered one started: the session's schedule), so that no
// renewal of the holder is in flight while it is frozen. Its hold then
// ends one TTL after a renewal that the backend answered before the
// freeze, however long a loaded machine makes a request wait in a
// pooler's queue or a server's run queue; with a renewal in flight at the
// freeze, the backend could extend the hold whenever that request reached
// it (lib/pq behind PgBouncer beside two CPU burners: a second after the
// freeze). When the signal came too late for that (the parent slower than
// the gap), the holder is thawed at once — a pause of milliseconds, far
// shorter than its terms — and the next renewal is tried, until within
// has passed. It returns the time taken just before the signal.
func (p *holderProc) freezeBetweenRenewals(renew, within time.Duration) time.Time {
	give := time.NewTimer(within)
	defer give.Stop()
	for {
		select { // an answer seen before this call may be old: wait for a new one
		case <-p.renewed:
		default:
		}
		var start time.Time
		select {
		case start = <-p.renewed:
		case <-give.C:
			p.c.Fatalf("holder %s: no renewal answered in time to freeze it between two renewals within %v", p.label, within)
		case <-p.c.ctx.Done():
			p.c.Fatalf("holder %s: waiting for a renewal to freeze it after: %v", p.label, p.c.ctx.Err())
		}
		frozeAt := time.Now()
		p.c.Must(freeze(p.pid), "SIGSTOP "+p.label)
		// Wall clocks of one machine: the holder's reading of the
		// renewal's start against this process's after the signal.
		after := time.Now()
		if next := start.Add(renew); after.Round(0).Before(next) {
			return frozeAt
		}
		p.c.Must(thaw(p.pid), "SIGCONT "+p.label)
		p.c.record(p.label, fmt.Sprintf("SIGSTOP came %v after its renewal started, not before its next one (renew %v): thawed at once, frozen after the next renewal instead",
			after.Round(0).Sub(start).Round(time.Millisecond), renew))
	}
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
