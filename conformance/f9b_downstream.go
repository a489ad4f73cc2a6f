package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// F9b's downstream stand-in: a system that cannot check fences but follows
// the two rules a fenced outbox asks of its downstream
// (leasecore.OutboxEntry), as an HTTP server on 127.0.0.1 in the suite's
// process. Relays (in the suite's process, or relay processes started with
// the holder protocol's RELAY) POST each entry as JSON; the answer, 200
// with "accepted", "duplicate" or "stale" in the body, is the
// acknowledgement. It records every delivery, so the case can count what
// reached it and what it accepted.

// wireEntry is an entry as it travels to the downstream.
type wireEntry struct {
	ID      string    `json:"id"`
	Seq     int64     `json:"seq"`
	Scope   string    `json:"scope"`
	Writer  string    `json:"writer"`
	Token   uint64    `json:"token"`
	Topic   string    `json:"topic"`
	Payload []byte    `json:"payload"`
	At      time.Time `json:"at"`
}

// The downstream's verdicts. The first three are acknowledgements.
const (
	verdictAccepted  = "accepted"  // new identity, version >= the scope's highest
	verdictDuplicate = "duplicate" // an identity it already processed: a no-op
	verdictStale     = "stale"     // a version below the scope's highest: rejected
	// verdictDropped: the request was held before it was processed and the
	// relay went away (killed): nothing was processed, nothing answered.
	verdictDropped = "dropped unprocessed (the relay went away)"
)

// delivery is one request the downstream received.
type delivery struct {
	e       wireEntry
	verdict string
}

// downstreamHold holds one request (the first to carry payload), before
// or after processing it, until the relay that sent it goes away.
type downstreamHold struct {
	payload      string
	processFirst bool
	reached      chan struct{} // closed when the request is held
}

// downstream is the stand-in. Its state is guarded by mu.
type downstream struct {
	url    string
	srv    *http.Server
	client *http.Client // the suite's own relays
	stop   chan struct{}

	mu      sync.Mutex
	highest map[string]leasecore.Token // per scope
	seen    map[string]bool            // identities processed
	log     []delivery
	hold    *downstreamHold
}

// startDownstream starts a stand-in on 127.0.0.1 that stops when the case
// ends.
func (c *caseRun) startDownstream() *downstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	c.Must(err, "listen for the downstream stand-in")
	d := &downstream{url: "http://" + ln.Addr().String() + "/deliver", stop: make(chan struct{}),
		highest: map[string]leasecore.Token{}, seen: map[string]bool{}}
	d.srv = &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}
	d.client = newDeliveryClient()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = d.srv.Serve(ln)
	}()
	c.cleanup(func() {
		close(d.stop) // held requests return
		_ = d.srv.Close()
		<-served
		d.client.CloseIdleConnections()
	})
	return d
}

// newDeliveryClient is the HTTP client of a relay: its own transport (no
// proxy: the stand-in is on 127.0.0.1), so its idle connections can be
// closed.
func newDeliveryClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}}
}

// postEntry delivers e to the downstream at url and returns nil when it
// answered 200, whatever its verdict: accepted, duplicate and stale are
// all acknowledgements.
func postEntry(ctx context.Context, client *http.Client, url string, e leasecore.OutboxEntry) error {
	body, err := json.Marshal(wireEntry{ID: e.ID, Seq: e.Seq, Scope: e.Scope, Writer: e.Writer, Token: uint64(e.Token),
		Topic: e.Topic, Payload: e.Payload, At: e.At})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("downstream answered %s: %s", resp.Status, strings.TrimSpace(string(answer)))
	}
	return nil
}

// deliver is a relay's deliver function for the suite's own relays.
func (d *downstream) deliver(ctx context.Context, e leasecore.OutboxEntry) error {
	return postEntry(ctx, d.client, d.url, e)
}

// holdOnce arms a hold of the next request that carries payload: before
// processing it (processFirst false: the entry is not processed at all if
// the relay goes away), or after processing it and before answering
// (processFirst true: processed, but the relay never hears so). The
// returned channel closes once that request is held.
func (d *downstream) holdOnce(payload string, processFirst bool) <-chan struct{} {
	h := &downstreamHold{payload: payload, processFirst: processFirst, reached: make(chan struct{})}
	d.mu.Lock()
	d.hold = h
	d.mu.Unlock()
	return h.reached
}

func (d *downstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Read the whole body first: only then does the server notice a client
	// that goes away (and cancel r.Context()) while a request is held.
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	var e wireEntry
	if err == nil {
		err = json.Unmarshal(body, &e)
	}
	if err != nil || e.ID == "" || e.Scope == "" {
		http.Error(w, fmt.Sprintf("not an outbox entry: %v", err), http.StatusBadRequest)
		return
	}
	d.mu.Lock()
	h := d.hold
	if h != nil && h.payload == string(e.Payload) {
		d.hold = nil
	} else {
		h = nil
	}
	verdict := verdictDropped
	if h == nil || h.processFirst {
		verdict = d.apply(e)
	}
	d.log = append(d.log, delivery{e, verdict})
	d.mu.Unlock()
	if h != nil {
		close(h.reached)
		select { // no answer: the relay is killed meanwhile
		case <-r.Context().Done():
		case <-d.stop:
		}
		return
	}
	_, _ = io.WriteString(w, verdict)
}

// apply is the downstream's rule; the caller holds mu.
func (d *downstream) apply(e wireEntry) string {
	switch {
	case d.seen[e.ID]:
		return verdictDuplicate
	case leasecore.Token(e.Token) < d.highest[e.Scope]:
		return verdictStale
	}
	d.seen[e.ID] = true
	d.highest[e.Scope] = leasecore.Token(e.Token)
	return verdictAccepted
}

// deliveries returns the log of scope's deliveries, in arrival order.
func (d *downstream) deliveries(scope string) []delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []delivery
	for _, dl := range d.log {
		if dl.e.Scope == scope {
			out = append(out, dl)
		}
	}
	return out
}

// describeScope says what reached the downstream for scope from writer,
// and what it accepted: "received from holder-a: 0; accepted: [holder-b
// version=2 report(B)]".
func (d *downstream) describeScope(scope, writer string) string {
	n := 0
	var accepted []string
	for _, dl := range d.deliveries(scope) {
		if dl.e.Writer == writer {
			n++
		}
		if dl.verdict == verdictAccepted {
			accepted = append(accepted, fmt.Sprintf("%s version=%d %s", dl.e.Writer, dl.e.Token, dl.e.Payload))
		}
	}
	return fmt.Sprintf("received from %s: %d; accepted: [%s]", writer, n, strings.Join(accepted, ", "))
}

// waitHeld waits until a held request arrived, ending the case when the
// relay process exits or answers first, or after a timeout.
func (c *caseRun) waitHeld(held <-chan struct{}, relay *holderProc, what string) {
	timeout := 30*time.Second + 10*c.traits.MinTTL
	select {
	case <-held:
	case line, ok := <-relay.replies:
		if !ok {
			c.Fatalf("relay %s exited before %s; stderr: %s", relay.label, what, relay.stderr.String())
		}
		c.Fatalf("relay %s answered %q before %s", relay.label, line, what)
	case <-time.After(timeout):
		c.Fatalf("relay %s: no request reached the downstream within %v (%s); stderr: %s", relay.label, timeout, what, relay.stderr.String())
	case <-c.ctx.Done():
		c.Fatalf("%s: %v", what, c.ctx.Err())
	}
}

// errNotKilled: a relay process outlived its SIGKILL.
var errNotKilled = errors.New("the process did not exit")
