package fencepg_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// fenceEvents collects a fence's events as "op writer/token accepted|rejected/floor [token space]".
type fenceEvents struct {
	mu     sync.Mutex
	events []string
}

func (e *fenceEvents) observe(ev leasecore.FenceEvent) {
	s := fmt.Sprintf("%s %s/%d ", ev.Op, ev.Claim.Writer, ev.Claim.Token)
	if ev.Result.Accepted {
		s += "accepted"
	} else {
		s += "rejected"
	}
	s += fmt.Sprintf("/%d", ev.Result.Floor)
	if errors.Is(ev.Err, leasecore.ErrTokenSpace) {
		s += " token space"
	} else if ev.Err != nil {
		s += " err " + ev.Err.Error()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, s)
}

// take returns the events so far and forgets them.
func (e *fenceEvents) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	got := e.events
	e.events = nil
	return got
}

func wantEvents(t *testing.T, what string, e *fenceEvents, want ...string) {
	t.Helper()
	if got := e.take(); strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("%s: fence events\n got %q\nwant %q", what, got, want)
	}
}

// TestFenceObserver: every form of the check reports one event per call
// that returns a Result — accepted or rejected, with the floor, and a
// rejection by a floor from another token space says so — to every
// observer; calls that end in an error report nothing; WithLogger logs the
// rejections.
func TestFenceObserver(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		var events, second fenceEvents
		var logBuf bytes.Buffer
		f := newFenceFixture(t, driver, fencepg.WithFenceObserver(events.observe), fencepg.WithFenceObserver(nil),
			fencepg.WithFenceObserver(second.observe), fencepg.WithLogger(slog.New(slog.NewJSONHandler(&logBuf, nil))),
			fencepg.WithLogger(nil))
		ctx := context.Background()
		const run = "run tx" // either fence's RunTx
		a := leasecore.Claim{Scope: "obs", Writer: "holder-a", Token: 1, Space: "postgres:a"}
		b := leasecore.Claim{Scope: "obs", Writer: "holder-b", Token: 2, Space: "postgres:a"}

		f.writeJob(t, a, 1)
		if _, err := f.fence.Advance(ctx, b); err != nil {
			t.Fatal(err)
		}
		f.writeJob(t, a, 2) // stale
		f.writeJob(t, b, 3)
		if _, err := f.fence.Advance(ctx, a); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, "run and advance", &events, run+" holder-a/1 accepted/1", "advance holder-b/2 accepted/2",
			run+" holder-a/1 rejected/2", run+" holder-b/2 accepted/2", "advance holder-a/1 rejected/2")
		if got := second.take(); len(got) != 5 {
			t.Errorf("second observer saw %q, want the same 5 events", got)
		}

		// Commit ending the caller's own transaction.
		commit := func(c leasecore.Claim) {
			t.Helper()
			var err error
			if p := f.resPool.Pgx; p != nil {
				tx, berr := p.Begin(ctx)
				if berr != nil {
					t.Fatal(berr)
				}
				_, err = f.fence.Pgx.Commit(ctx, tx, c)
			} else {
				tx, berr := f.resPool.SQL.BeginTx(ctx, nil)
				if berr != nil {
					t.Fatal(berr)
				}
				_, err = f.fence.SQL.Commit(ctx, tx, c)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		commit(b)
		commit(a)
		wantEvents(t, "commit", &events, "commit holder-b/2 accepted/2", "commit holder-a/1 rejected/2")

		// A floor from another lease service: the rejection says so.
		other := leasecore.Claim{Scope: "obs", Writer: "holder-c", Token: 1, Space: "etcd:b"}
		f.writeJobErr(t, other)
		wantEvents(t, "token space", &events, run+" holder-c/1 rejected/2 token space")

		// Errors without a Result: the caller's function failed, bad input.
		boom := errors.New("boom")
		var err error
		if f.fence.Pgx != nil {
			_, err = f.fence.Pgx.RunTx(ctx, b, func(pgx.Tx) error { return boom })
		} else {
			_, err = f.fence.SQL.RunTx(ctx, b, func(*sql.Tx) error { return boom })
		}
		if !errors.Is(err, boom) {
			t.Fatalf("run with a failing function: %v", err)
		}
		if _, err := f.fence.Advance(ctx, leasecore.Claim{Scope: "obs", Writer: "holder-b"}); !errors.Is(err, leasecore.ErrInvalidArgument) {
			t.Fatalf("advance without a token: %v", err)
		}
		wantEvents(t, "errors", &events)

		// The part store reports as its Write and WriteBatch.
		var resEvents fenceEvents
		res := func() *fencepg.Resource {
			opts := []fencepg.Option{fencepg.WithFenceObserver(resEvents.observe)}
			r, err := f.resPool.Resource(opts...)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}()
		w := func(c leasecore.Claim) {
			t.Helper()
			if _, err := res.Write(ctx, leasecore.Write{Scope: "parts", Part: "p", Content: "x", Writer: c.Writer, Token: c.Token}); err != nil {
				t.Fatal(err)
			}
		}
		w(b)
		w(a)
		if _, err := res.WriteBatch(ctx, leasecore.Batch{Scope: "parts", Writer: "holder-b", Token: 2,
			Parts: []leasecore.PartContent{{Part: "p", Content: "y"}, {Part: "q", Content: "z"}}}); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, "resource", &resEvents, "write holder-b/2 accepted/2", "write holder-a/1 rejected/2",
			"write batch holder-b/2 accepted/2")

		// The logger: one WARN per stale rejection, the ERROR of the token
		// space, nothing for acceptances at the default level.
		var msgs []string
		for _, line := range strings.Split(strings.TrimSpace(logBuf.String()), "\n") {
			var r struct {
				Level, Msg, Op, Writer string
				Token, Floor           int
			}
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			msgs = append(msgs, fmt.Sprintf("%s %s: %s %s/%d floor %d", r.Level, r.Msg, r.Op, r.Writer, r.Token, r.Floor))
		}
		want := []string{
			"WARN stale write rejected: " + run + " holder-a/1 floor 2",
			"WARN stale write rejected: advance holder-a/1 floor 2",
			"WARN stale write rejected: commit holder-a/1 floor 2",
			"ERROR write rejected: token from another lease service: " + run + " holder-c/1 floor 2",
		}
		if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
			t.Errorf("log records:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
		}
	})
}

// writeJobErr is writeJob for a claim whose rejection comes with an error
// (a floor from another token space).
func (f fenceFixture) writeJobErr(t *testing.T, c leasecore.Claim) {
	t.Helper()
	ctx := context.Background()
	var res leasecore.Result
	var err error
	if f.fence.Pgx != nil {
		res, err = f.fence.Pgx.RunTx(ctx, c, func(pgx.Tx) error { return nil })
	} else {
		res, err = f.fence.SQL.RunTx(ctx, c, func(*sql.Tx) error { return nil })
	}
	if res.Accepted || !errors.Is(err, leasecore.ErrTokenSpace) {
		t.Fatalf("claim %+v: %+v, %v; want a rejection with ErrTokenSpace", c, res, err)
	}
}

// TestFenceObserverSendBatch: a pipeline reports one event per call, also
// when it advanced the floor on the way (a new token), and a stale one is
// rejected.
func TestFenceObserverSendBatch(t *testing.T) {
	var events fenceEvents
	f := newFenceFixture(t, pgopen.Pgx, fencepg.WithFenceObserver(events.observe))
	ctx := context.Background()
	send := func(c leasecore.Claim) {
		t.Helper()
		b := &pgx.Batch{}
		b.Queue(upsertRun, c.Scope, c.Writer, int64(c.Token), 1)
		if _, err := f.fence.Pgx.SendBatch(ctx, f.resPool.Pgx, c, b); err != nil {
			t.Fatal(err)
		}
	}
	a := leasecore.Claim{Scope: "pipe", Writer: "holder-a", Token: 1}
	b := leasecore.Claim{Scope: "pipe", Writer: "holder-b", Token: 2}
	send(a) // new scope: advanced, then sent again
	send(a) // the fast path
	send(b)
	send(a)
	wantEvents(t, "send batch", &events, "send batch holder-a/1 accepted/1", "send batch holder-a/1 accepted/1",
		"send batch holder-b/2 accepted/2", "send batch holder-a/1 rejected/2")

	all := newFenceFixture(t, pgopen.Pgx, fencepg.WithFenceObserver(events.observe), fencepg.WithAttemptLog(leasecore.LogAll))
	f.fence = all.fence
	send(leasecore.Claim{Scope: "pipe", Writer: "holder-c", Token: 3})
	wantEvents(t, "send batch with LogAll", &events, "send batch holder-c/3 accepted/3")
}
