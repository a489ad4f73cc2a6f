package memfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

const scope = "daily-report"

func write(part, content, writer string, tok leasecore.Token) leasecore.Write {
	return leasecore.Write{Scope: scope, Part: part, Content: content, Writer: writer, Token: tok}
}

func mustWrite(t *testing.T, r *memfence.Resource, w leasecore.Write, accepted bool, floor leasecore.Token) {
	t.Helper()
	res, err := r.Write(ctx, w)
	if err != nil {
		t.Fatalf("Write(%s/%s token %d) = %v", w.Scope, w.Part, w.Token, err)
	}
	if res.Accepted != accepted || res.Floor != floor {
		t.Fatalf("Write(%s/%s by %s token %d) = %+v, want accepted=%v floor=%d",
			w.Scope, w.Part, w.Writer, w.Token, res, accepted, floor)
	}
}

func readPart(t *testing.T, r *memfence.Resource, part string) (leasecore.StoredPart, bool) {
	t.Helper()
	p, ok, err := r.ReadPart(ctx, scope, part)
	if err != nil {
		t.Fatalf("ReadPart(%s) = %v", part, err)
	}
	return p, ok
}

func floor(t *testing.T, r *memfence.Resource, s string) leasecore.Token {
	t.Helper()
	f, err := r.Floor(ctx, s)
	if err != nil {
		t.Fatalf("Floor(%s) = %v", s, err)
	}
	return f
}

func TestResourceFence(t *testing.T) {
	r := memfence.NewResource()
	if f := floor(t, r, scope); f != 0 {
		t.Fatalf("Floor of an unknown scope = %d, want 0", f)
	}
	if _, ok := readPart(t, r, "summary"); ok {
		t.Fatal("ReadPart of a never-written part reported ok")
	}

	before := time.Now()
	// A scope seen for the first time accepts any valid token.
	mustWrite(t, r, write("summary", "a-1", "holder-a", 1), true, 1)
	// I3: an equal token is the same holding period writing again.
	mustWrite(t, r, write("summary", "a-2", "holder-a", 1), true, 1)
	p, ok := readPart(t, r, "summary")
	if !ok || p.Content != "a-2" || p.Writer != "holder-a" || p.Token != 1 || p.Scope != scope || p.Part != "summary" {
		t.Fatalf("summary = %+v, %v; want a-2 by holder-a with token 1", p, ok)
	}
	if p.WrittenAt.Before(before) {
		t.Errorf("WrittenAt %v is before the write", p.WrittenAt)
	}

	// holder-b (token 2) rewrites summary only.
	mustWrite(t, r, write("summary", "b-1", "holder-b", 2), true, 2)
	// The stale holder is rejected on the part b wrote...
	mustWrite(t, r, write("summary", "a-stale", "holder-a", 1), false, 2)
	// ...and on the part b never touched (F7: the floor is per scope).
	mustWrite(t, r, write("detail", "a-stale", "holder-a", 1), false, 2)

	if p, _ := readPart(t, r, "summary"); p.Content != "b-1" || p.Token != 2 {
		t.Errorf("summary = %+v, want b-1 with token 2", p)
	}
	if _, ok := readPart(t, r, "detail"); ok {
		t.Error("a rejected write created the detail part")
	}
	if f := floor(t, r, scope); f != 2 {
		t.Errorf("Floor = %d, want 2", f)
	}

	// Tokens need not be consecutive (etcd revisions are not).
	mustWrite(t, r, write("detail", "c-1", "holder-c", 17), true, 17)
	mustWrite(t, r, write("summary", "b-late", "holder-b", 2), false, 17)

	// Another scope has its own floor.
	other := leasecore.Write{Scope: "weekly-report", Part: "summary", Content: "x", Writer: "holder-a", Token: 1}
	mustWrite(t, r, other, true, 1)
	if f := floor(t, r, scope); f != 17 {
		t.Errorf("Floor(%s) = %d after a write to another scope, want 17", scope, f)
	}

	// The log holds every attempt of the scope, oldest first, rejected
	// ones included.
	got, err := r.Attempts(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	want := []leasecore.Attempt{
		{Scope: scope, Part: "summary", Writer: "holder-a", Token: 1, Accepted: true, Floor: 1},
		{Scope: scope, Part: "summary", Writer: "holder-a", Token: 1, Accepted: true, Floor: 1},
		{Scope: scope, Part: "summary", Writer: "holder-b", Token: 2, Accepted: true, Floor: 2},
		{Scope: scope, Part: "summary", Writer: "holder-a", Token: 1, Accepted: false, Floor: 2},
		{Scope: scope, Part: "detail", Writer: "holder-a", Token: 1, Accepted: false, Floor: 2},
		{Scope: scope, Part: "detail", Writer: "holder-c", Token: 17, Accepted: true, Floor: 17},
		{Scope: scope, Part: "summary", Writer: "holder-b", Token: 2, Accepted: false, Floor: 17},
	}
	if len(got) != len(want) {
		t.Fatalf("Attempts = %d entries, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		a := got[i]
		if a.At.Before(before) || (i > 0 && a.At.Before(got[i-1].At)) {
			t.Errorf("attempt %d At = %v, out of order", i, a.At)
		}
		a.At = time.Time{}
		if a != want[i] {
			t.Errorf("attempt %d = %+v, want %+v", i, a, want[i])
		}
	}
	if got, _ := r.Attempts(ctx, "unknown-scope"); len(got) != 0 {
		t.Errorf("Attempts(unknown) = %+v, want none", got)
	}
}

func TestResourceRejectsBadInputAndChangesNothing(t *testing.T) {
	r := memfence.NewResource()
	mustWrite(t, r, write("summary", "ok", "holder-a", 1), true, 1)

	bad := []struct {
		field string
		w     leasecore.Write
	}{
		{"scope", leasecore.Write{Scope: "", Part: "summary", Writer: "holder-a", Token: 2}},
		{"part", write("", "x", "holder-a", 2)},
		{"writer", write("summary", "x", " holder-a", 2)},
		{"token", write("summary", "x", "holder-a", 0)},
		{"token", write("summary", "x", "holder-a", leasecore.MaxToken+1)},
		{"content", write("summary", "x\x00y", "holder-a", 2)},
	}
	for _, b := range bad {
		_, err := r.Write(ctx, b.w)
		var ae *leasecore.ArgError
		if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != b.field {
			t.Errorf("Write(%+v) = %v, want an ArgError for %q", b.w, err, b.field)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Write(cancelled, write("summary", "x", "holder-a", 2)); !errors.Is(err, context.Canceled) {
		t.Errorf("Write(cancelled) = %v, want context.Canceled", err)
	}

	if f := floor(t, r, scope); f != 1 {
		t.Errorf("Floor = %d, want 1", f)
	}
	if p, _ := readPart(t, r, "summary"); p.Content != "ok" {
		t.Errorf("summary = %+v, want unchanged", p)
	}
	if got, _ := r.Attempts(ctx, scope); len(got) != 1 {
		t.Errorf("Attempts = %+v, want only the valid write", got)
	}

	// Reads validate too.
	if _, err := r.Floor(ctx, ""); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("Floor(\"\") = %v", err)
	}
	if _, _, err := r.ReadPart(ctx, scope, ""); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("ReadPart(part \"\") = %v", err)
	}
	if _, err := r.Attempts(cancelled, scope); !errors.Is(err, context.Canceled) {
		t.Errorf("Attempts(cancelled) = %v", err)
	}
}

// gate pauses the write of one writer inside the commit gap until the test
// lets it go: the in-memory form of a transaction paused before COMMIT.
type gate struct {
	writer  string
	paused  chan struct{}
	release chan struct{}
}

func newGate(writer string) *gate {
	return &gate{writer: writer, paused: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) gap(ctx context.Context, w leasecore.Write) error {
	if w.Writer == g.writer {
		close(g.paused)
		<-g.release
	}
	return nil
}

func waitLockWaits(t *testing.T, r *memfence.Resource, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.LockWaits() != n {
		if time.Now().After(deadline) {
			t.Fatalf("LockWaits = %d after 10s, want %d", r.LockWaits(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// F6b: the first writer has advanced the floor and pauses before applying;
// the second writer of the scope waits for it, then decides against the
// floor the first one left.
func TestResourceCommitGapSerializesWriters(t *testing.T) {
	tests := []struct {
		name             string
		first, second    leasecore.Write
		wantOK           bool // the second write's outcome
		finalContent     string
		finalFloor       leasecore.Token
		secondFloorAfter leasecore.Token
	}{
		{
			name:   "older first: both accepted, newer data wins",
			first:  write("summary", "old", "holder-a", 1),
			second: write("summary", "new", "holder-b", 2),
			wantOK: true, finalContent: "new", finalFloor: 2, secondFloorAfter: 2,
		},
		{
			name:   "newer first: the older is rejected",
			first:  write("summary", "new", "holder-b", 2),
			second: write("detail", "old", "holder-a", 1),
			wantOK: false, finalContent: "new", finalFloor: 2, secondFloorAfter: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(tc.first.Writer)
			r := memfence.NewResource(memfence.WithCommitGap(g.gap))

			firstDone := make(chan leasecore.Result, 1)
			go func() {
				res, err := r.Write(ctx, tc.first)
				if err != nil {
					t.Errorf("first Write = %v", err)
				}
				firstDone <- res
			}()
			<-g.paused

			secondDone := make(chan leasecore.Result, 1)
			go func() {
				res, err := r.Write(ctx, tc.second)
				if err != nil {
					t.Errorf("second Write = %v", err)
				}
				secondDone <- res
			}()
			waitLockWaits(t, r, 1)
			select {
			case res := <-secondDone:
				t.Fatalf("second write finished (%+v) while the first was paused", res)
			default:
			}

			close(g.release)
			if res := <-firstDone; !res.Accepted || res.Floor != tc.first.Token {
				t.Errorf("first write = %+v, want accepted with floor %d", res, tc.first.Token)
			}
			res := <-secondDone
			if res.Accepted != tc.wantOK || res.Floor != tc.secondFloorAfter {
				t.Errorf("second write = %+v, want accepted=%v floor=%d", res, tc.wantOK, tc.secondFloorAfter)
			}
			if n := r.LockWaits(); n != 0 {
				t.Errorf("LockWaits = %d after both writes, want 0", n)
			}
			if p, _ := readPart(t, r, "summary"); p.Content != tc.finalContent {
				t.Errorf("summary = %q, want %q", p.Content, tc.finalContent)
			}
			if f := floor(t, r, scope); f != tc.finalFloor {
				t.Errorf("Floor = %d, want %d", f, tc.finalFloor)
			}
			atts, _ := r.Attempts(ctx, scope)
			if len(atts) != 2 || atts[0].Writer != tc.first.Writer || atts[1].Writer != tc.second.Writer {
				t.Errorf("Attempts = %+v, want the first then the second writer", atts)
			}
		})
	}
}

// A write abandoned in the commit gap (the transaction rolled back) applies
// nothing: no floor, no data, no log entry.
func TestResourceCommitGapErrorAppliesNothing(t *testing.T) {
	errAbort := errors.New("test: connection lost before commit")
	r := memfence.NewResource(memfence.WithCommitGap(func(_ context.Context, w leasecore.Write) error {
		if w.Writer == "holder-b" {
			return errAbort
		}
		return nil
	}))
	mustWrite(t, r, write("summary", "a", "holder-a", 1), true, 1)

	res, err := r.Write(ctx, write("summary", "b", "holder-b", 2))
	if !errors.Is(err, errAbort) {
		t.Fatalf("Write through a failing gap = %+v, %v; want the gap's error", res, err)
	}
	if res != (leasecore.Result{}) {
		t.Errorf("failed Write returned %+v, want a zero Result", res)
	}
	if f := floor(t, r, scope); f != 1 {
		t.Errorf("Floor = %d, want 1 (unchanged)", f)
	}
	if p, _ := readPart(t, r, "summary"); p.Content != "a" || p.Token != 1 {
		t.Errorf("summary = %+v, want unchanged", p)
	}
	if atts, _ := r.Attempts(ctx, scope); len(atts) != 1 {
		t.Errorf("Attempts = %+v, want only holder-a's", atts)
	}
	// The resource is not left locked.
	mustWrite(t, r, write("detail", "a", "holder-a", 1), true, 1)
}
