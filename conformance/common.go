package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The scenario of the lease-fencing article (SOURCES.md): a daily report
// job with one scope and two parts, run by holders holder-a and holder-b.
const (
	leaseName   = "daily-report"
	scope       = "daily-report"
	partSummary = "summary"
	partDetail  = "detail"
	holderA     = "holder-a"
	holderB     = "holder-b"
)

// openLease opens a lease client and its inspector, or ends the case.
func (c *caseRun) openLease(h Harness) (leasecore.Lease, leasecore.LeaseInspector) {
	l, err := h.OpenLease(c.ctx)
	c.Must(err, "open lease client")
	insp, ok := l.(leasecore.LeaseInspector)
	if !ok {
		c.Fatalf("the harness's lease client %T does not implement leasecore.LeaseInspector", l)
	}
	// One round trip before the case times anything: a client that
	// connects lazily (a pgx pool, a database/sql pool) would otherwise
	// start its connection — a server process forked, authentication —
	// inside the first timed request, and expiryBound allows for the
	// request's way to the server, not for making the connection. Reading
	// the state of a name no case uses changes nothing.
	_, err = insp.Inspect(c.ctx, "conformance-connect")
	c.Must(err, "inspect through the new lease client")
	return l, insp
}

// openResource opens a fenced resource client, or ends the case.
func (c *caseRun) openResource(h Harness) Resource {
	r, err := h.OpenResource(c.ctx)
	c.Must(err, "open fenced resource")
	return r
}

// write performs one write, ending the case on an error (a rejection is
// not an error).
func (c *caseRun) write(r leasecore.FencedResource, w leasecore.Write) leasecore.Result {
	res, err := r.Write(c.ctx, w)
	c.Must(err, fmt.Sprintf("write %s/%s by %s with token %d", w.Scope, w.Part, w.Writer, w.Token))
	return res
}

// readPart reads a part, ending the case on an error.
func (c *caseRun) readPart(r backendkit.ResourceReader, scope, part string) (leasecore.StoredPart, bool) {
	p, ok, err := r.ReadPart(c.ctx, scope, part)
	c.Must(err, fmt.Sprintf("read part %s/%s", scope, part))
	return p, ok
}

// floor reads a scope's floor, ending the case on an error.
func (c *caseRun) floor(r backendkit.ResourceReader, scope string) leasecore.Token {
	f, err := r.Floor(c.ctx, scope)
	c.Must(err, "read floor of "+scope)
	return f
}

// expiryBound is the suite's stated allowance for seeing a hold end, on
// top of its TTL and the backend's declared TTL granularity g: the
// request's way to the server (the backend starts the TTL when it executes
// the request, after the suite read its clock), the backend's own expiry
// machinery (etcd's lessor finds expired leases in rounds and revokes them
// through raft, an fsynced write), the readers' round trips and the
// suite's polling, on a loaded machine. Measured with the load average at
// 5-8 on 2 CPUs: a PostgreSQL hold of 300ms behind PgBouncer seen free
// after 524ms; etcd holds of 1s (granularity 1s) after up to 3.07s. A
// quarter of the TTL plus 200ms plus half the granularity: a backend that
// doubles a TTL of 300ms or more with no granularity, or of 2.3s or more
// with etcd's second, still overshoots it, so it fails.
func expiryBound(ttl, g time.Duration) time.Duration { return ttl/4 + 200*time.Millisecond + g/2 }

// renewingWait is how long a case lets a holder that renews in the
// background run before it checks that the holder still has the lease:
// the case's running time (pausedRunning, scaled with the TTL), and never
// less than the latest the suite lets an unrenewed hold of ttl be seen
// (ttl + granularity + expiryBound, as waitFree), counted from the
// acquire, which came before the wait. So the check fails for a holder
// whose renewals do not reach the backend, whatever its granularity (with
// etcd's second, 2×TTL fell 0.2 s short of it).
func (c *caseRun) renewingWait(ttl time.Duration) time.Duration {
	g := c.traits.TTLGranularity
	return max(c.scale(pausedRunning, pausedTTL), ttl+g+expiryBound(ttl, g))
}

// waitFree polls the backend until lease name is no longer held by the
// backend's own clock, and checks that this happened within ttl, the
// declared granularity and expiryBound, counted from since: the suite's
// clock read before the last request that could have started or extended
// the hold was sent (from is how the line names that moment). It returns
// the moment it saw the lease free. The suite never decides expiry by its
// own clock; it asks the backend, and only bounds how late the answer may
// come: when its own answer came late (the suite stalled), the backend's
// word on the time left decides. A hold still there at twice the limit ends
// the case.
func (c *caseRun) waitFree(insp leasecore.LeaseInspector, name string, ttl time.Duration, since time.Time, hold, from string) time.Time {
	return c.awaitFree(insp, name, ttl, since, hold, from, nil)
}

// awaitFree is waitFree calling tick, when not nil, between its polls.
func (c *caseRun) awaitFree(insp leasecore.LeaseInspector, name string, ttl time.Duration, since time.Time, hold, from string, tick func()) time.Time {
	g := c.traits.TTLGranularity
	bound := expiryBound(ttl, g)
	limit := ttl + g + bound
	what := fmt.Sprintf("%s ends by the backend's clock within ttl + granularity + bound of %s", hold, from)
	expected := fmt.Sprintf("free within %v (ttl %v + granularity %v + bound %v)", limit, ttl, g, bound)
	poll := max(ttl/100, 5*time.Millisecond)
	// The last Inspect that found the hold: when it was sent and answered
	// (since since), and the time the backend said the hold had left.
	var held struct {
		seen           bool
		sent, answered time.Duration
		remaining      time.Duration
	}
	for {
		sent := time.Since(since)
		st, err := insp.Inspect(c.ctx, name)
		c.Must(err, "inspect lease "+name)
		elapsed := time.Since(since)
		if !st.Held {
			// The backend ran each Inspect between its sending and its
			// answer. The hold is late when an Inspect sent after the limit
			// still found it; on time when this answer came within the
			// limit. Otherwise the suite's own process or connection stalled
			// across the limit, and the backend's word decides: the time
			// left it gave in the last answer that found the hold.
			onTime := elapsed <= limit
			actual := fmt.Sprintf("free after %v", elapsed.Round(time.Millisecond))
			switch {
			case onTime || held.sent > limit:
			case !held.seen: // no answer found it held: nothing shows it lasted past the limit
				onTime = true
				actual += fmt.Sprintf(" (answered late; sent after %v, the first Inspect)", sent.Round(time.Millisecond))
			default:
				end := held.answered + held.remaining
				onTime = end <= limit
				actual += fmt.Sprintf(" (answered late; the last Inspect that found it held was sent after %v, answered after %v with %v left: ends by %v)",
					held.sent.Round(time.Millisecond), held.answered.Round(time.Millisecond), held.remaining.Round(time.Millisecond), end.Round(time.Millisecond))
			}
			c.Check("TTL", what, onTime, expected, actual)
			return time.Now()
		}
		held.seen, held.sent, held.answered, held.remaining = true, sent, elapsed, st.Remaining
		if elapsed > 2*limit {
			c.Check("TTL", what, false, expected, fmt.Sprintf("still held after %v, twice the limit, by %s token=%d (remaining %v)",
				elapsed.Round(time.Millisecond), backendkit.Quote(st.Holder), st.Token, st.Remaining.Round(time.Millisecond)))
			c.stop()
		}
		if tick != nil {
			tick()
		}
		select {
		case <-c.ctx.Done():
			c.Fatalf("waiting for lease %s to expire: %v", name, c.ctx.Err())
		case <-time.After(poll):
		}
	}
}

// latch pauses one writer inside a Gap until opened: the CountDownLatch of
// the interleavings of the lease-fencing article (SOURCES.md).
type latch struct {
	writer  string
	paused  chan struct{} // closed when the writer reached the gap
	release chan struct{} // closed to let it go on
	once    sync.Once
}

func newLatch(writer string) *latch {
	return &latch{writer: writer, paused: make(chan struct{}), release: make(chan struct{})}
}

// gap is the Gap: it blocks the latch's writer, lets every other pass.
func (l *latch) gap(ctx context.Context, w leasecore.Write) error {
	if w.Writer != l.writer {
		return nil
	}
	l.once.Do(func() { close(l.paused) })
	select {
	case <-l.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitPaused waits until the latch's writer is inside the gap.
func (c *caseRun) waitPaused(l *latch) {
	select {
	case <-l.paused:
	case <-time.After(30 * time.Second):
		c.Fatalf("%s never reached the gap", l.writer)
	case <-c.ctx.Done():
		c.Fatalf("waiting for %s to reach the gap: %v", l.writer, c.ctx.Err())
	}
}

// outcome is a write's result delivered from another goroutine.
type outcome struct {
	res leasecore.Result
	err error
}

// goWrite starts a write in its own goroutine.
func goWrite(ctx context.Context, r leasecore.FencedResource, w leasecore.Write) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := r.Write(ctx, w)
		ch <- outcome{res, err}
	}()
	return ch
}

// await receives a write's outcome, ending the case on an error.
func (c *caseRun) await(ch <-chan outcome, what string) leasecore.Result {
	select {
	case o := <-ch:
		c.Must(o.err, what)
		return o.res
	case <-c.ctx.Done():
		c.Fatalf("%s: %v", what, c.ctx.Err())
	}
	return leasecore.Result{}
}

// Helpers for the holder protocol's reply lines.

// verb returns the first word of a reply line.
func verb(line string) string {
	v, _, _ := strings.Cut(line, " ")
	return v
}

// verbOK returns "VERB ok=B" of a reply line such as "RENEW ok=true token=2".
func verbOK(line string) string {
	f := strings.Fields(line)
	if len(f) >= 2 {
		return f[0] + " " + f[1]
	}
	return line
}

// trimFloor drops the floor field of a WRITE reply.
func trimFloor(line string) string {
	if i := strings.Index(line, " floor="); i >= 0 {
		return line[:i]
	}
	return line
}

// verbAccepted reports whether a WRITE reply says accepted=true.
func verbAccepted(line string) bool { return strings.Contains(line, "accepted=true") }
