package fenceetcd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
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

// TestFenceObserver: Advance, Commit, Write and WriteBatch report one
// event per call that returns a Result — one for a first Commit that
// advanced the floor on the way — to every observer; a rejection by a
// floor from another token space says so; calls that end in an error
// report nothing; WithLogger logs the rejections.
func TestFenceObserver(t *testing.T) {
	f := newFixture(t)
	var events, second fenceEvents
	var logBuf bytes.Buffer
	fe := f.newFence(t, fenceetcd.WithFenceObserver(events.observe), fenceetcd.WithFenceObserver(nil),
		fenceetcd.WithFenceObserver(second.observe), fenceetcd.WithLogger(slog.New(slog.NewJSONHandler(&logBuf, nil))),
		fenceetcd.WithLogger(nil))
	ctx := context.Background()
	a := leasecore.Claim{Scope: "obs", Writer: "holder-a", Token: 5, Space: "etcd:a"}
	b := leasecore.Claim{Scope: "obs", Writer: "holder-b", Token: 9, Space: "etcd:a"}

	commit(t, fe, a, f.putOwn("run=A")) // first of the scope: advance, then the guarded Txn
	commit(t, fe, a, f.putOwn("run=A2"))
	if _, err := fe.Advance(ctx, b); err != nil {
		t.Fatal(err)
	}
	commit(t, fe, a, f.putOwn("run=stale"))
	if _, err := fe.Advance(ctx, a); err != nil {
		t.Fatal(err)
	}
	commit(t, fe, b, f.putOwn("run=B"))
	wantEvents(t, "commit and advance", &events, "commit holder-a/5 accepted/5", "commit holder-a/5 accepted/5",
		"advance holder-b/9 accepted/9", "commit holder-a/5 rejected/9", "advance holder-a/5 rejected/9",
		"commit holder-b/9 accepted/9")
	if got := second.take(); len(got) != 6 {
		t.Errorf("second observer saw %q, want the same 6 events", got)
	}

	// A floor from another lease service: the rejection says so.
	other := leasecore.Claim{Scope: "obs", Writer: "holder-c", Token: 7, Space: "postgres:b"}
	if res, _, err := fe.Commit(ctx, other, f.putOwn("run=C")); res.Accepted || !errors.Is(err, leasecore.ErrTokenSpace) {
		t.Fatalf("claim of another space: %+v, %v; want a rejection with ErrTokenSpace", res, err)
	}
	wantEvents(t, "token space", &events, "commit holder-c/7 rejected/9 token space")

	// Errors without a Result report nothing: bad input, a transaction
	// writing the fence's own keys.
	if _, _, err := fe.Commit(ctx, leasecore.Claim{Scope: "obs", Writer: "holder-b"}, f.putOwn("x=1")); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Fatalf("commit without a token: %v", err)
	}
	if _, err := fe.Advance(ctx, leasecore.Claim{Scope: "", Writer: "holder-b", Token: 9}); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Fatalf("advance without a scope: %v", err)
	}
	wantEvents(t, "errors", &events)

	// The part store reports as its Write and WriteBatch.
	var resEvents fenceEvents
	res, err := fenceetcd.NewResource(f.cli, fenceetcd.WithPrefix(f.prefix), fenceetcd.WithFenceObserver(resEvents.observe))
	if err != nil {
		t.Fatal(err)
	}
	write := func(c leasecore.Claim) {
		t.Helper()
		if _, err := res.Write(ctx, leasecore.Write{Scope: "parts", Part: "p", Content: "x", Writer: c.Writer, Token: c.Token}); err != nil {
			t.Fatal(err)
		}
	}
	write(b)
	write(a)
	if _, err := res.WriteBatch(ctx, leasecore.Batch{Scope: "parts", Writer: "holder-b", Token: 9,
		Parts: []leasecore.PartContent{{Part: "p", Content: "y"}, {Part: "q", Content: "z"}}}); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, "resource", &resEvents, "write holder-b/9 accepted/9", "write holder-a/5 rejected/9",
		"write batch holder-b/9 accepted/9")

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
		"WARN stale write rejected: commit holder-a/5 floor 9",
		"WARN stale write rejected: advance holder-a/5 floor 9",
		"ERROR write rejected: token from another lease service: commit holder-c/7 floor 9",
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("log records:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
}
