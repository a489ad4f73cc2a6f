// Package backendtest holds the checks a backend's own unit tests share:
// write and read back through the leasecore interfaces, and compare with
// what the contract says. The conformance suite checks the contract end to
// end; these helpers keep each backend's finer tests short and alike.
package backendtest

import (
	"context"
	"errors"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Write writes and fails the test on an error (a rejection is not one).
func Write(tb testing.TB, r leasecore.FencedResource, scope, part, content, writer string, token leasecore.Token) leasecore.Result {
	tb.Helper()
	res, err := r.Write(context.Background(), leasecore.Write{
		Scope: scope, Part: part, Content: content, Writer: writer, Token: token})
	if err != nil {
		tb.Fatalf("write %s/%s token %d: %v", scope, part, token, err)
	}
	return res
}

// WantResult checks a write's outcome.
func WantResult(tb testing.TB, what string, got leasecore.Result, accepted bool, floor leasecore.Token) {
	tb.Helper()
	if got.Accepted != accepted || got.Floor != floor {
		tb.Fatalf("%s: got %+v, want accepted=%v floor=%d", what, got, accepted, floor)
	}
}

// WantPart checks the stored part; content "" means it must be absent.
func WantPart(tb testing.TB, r backendkit.ResourceReader, scope, part, content, writer string, token leasecore.Token) {
	tb.Helper()
	p, ok, err := r.ReadPart(context.Background(), scope, part)
	if err != nil {
		tb.Fatal(err)
	}
	if content == "" {
		if ok {
			tb.Fatalf("part %s/%s: got %+v, want absent", scope, part, p)
		}
		return
	}
	if !ok || p.Scope != scope || p.Part != part || p.Content != content || p.Writer != writer || p.Token != token ||
		p.WrittenAt.IsZero() {
		tb.Fatalf("part %s/%s: got %+v (ok=%v), want %.40q by %s token %d", scope, part, p, ok, content, writer, token)
	}
}

// WantFloor checks a scope's floor.
func WantFloor(tb testing.TB, r backendkit.ResourceReader, scope string, want leasecore.Token) {
	tb.Helper()
	got, err := r.Floor(context.Background(), scope)
	if err != nil {
		tb.Fatal(err)
	}
	if got != want {
		tb.Fatalf("floor of %s: got %d, want %d", scope, got, want)
	}
}

// WantHold checks that err is a *leasecore.HoldError wrapping sentinel
// (ErrHeld or ErrLost) for op, with exactly the given reason.
func WantHold(tb testing.TB, err error, sentinel error, op, reason string) {
	tb.Helper()
	var he *leasecore.HoldError
	if !errors.As(err, &he) || !errors.Is(err, sentinel) {
		tb.Fatalf("%s: got error %v, want a *leasecore.HoldError wrapping %v", op, err, sentinel)
	}
	if he.Op != op || he.Reason != reason {
		tb.Fatalf("%s: got Op %q Reason %q, want Op %q Reason %q (error: %v)", op, he.Op, he.Reason, op, reason, err)
	}
}
