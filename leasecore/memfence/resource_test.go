package memfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
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
		{"token", write("summary", "x", "holder-a", backendkit.MaxToken+1)},
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
