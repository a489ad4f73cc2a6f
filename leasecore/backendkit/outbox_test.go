package backendkit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

func TestCheckOutboxEntry(t *testing.T) {
	ctx := context.Background()
	ok := leasecore.Claim{Scope: "s", Writer: "w", Token: 1}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		c       leasecore.Claim
		topic   string
		payload []byte
		field   string // "" : valid
	}{
		{"valid", ctx, ok, "report-published", []byte("x"), ""},
		{"empty payload", ctx, ok, "t", nil, ""},
		{"binary payload", ctx, ok, "t", []byte{0, 0xff, 0}, ""},
		{"largest payload", ctx, ok, "t", make([]byte, backendkit.MaxPayloadLen), ""},
		{"empty topic", ctx, ok, "", nil, "topic"},
		{"NUL in topic", ctx, ok, "a\x00b", nil, "topic"},
		{"payload too large", ctx, ok, "t", make([]byte, backendkit.MaxPayloadLen+1), "payload"},
		{"no scope", ctx, leasecore.Claim{Writer: "w", Token: 1}, "t", nil, "scope"},
		{"no writer", ctx, leasecore.Claim{Scope: "s", Token: 1}, "t", nil, "writer"},
		{"token 0", ctx, leasecore.Claim{Scope: "s", Writer: "w"}, "t", nil, "token"},
		{"bad space", ctx, leasecore.Claim{Scope: "s", Writer: "w", Token: 1, Space: " x"}, "t", nil, "space"},
	} {
		err := backendkit.CheckOutboxEntry(tc.ctx, "outbox add", tc.c, tc.topic, tc.payload)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var ae *leasecore.ArgError
		if !errors.As(err, &ae) || ae.Field != tc.field || !errors.Is(err, leasecore.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want an ArgError for field %q", tc.name, err, tc.field)
		}
	}
	if err := backendkit.CheckOutboxEntry(cancelled, "outbox add", ok, "t", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	// An over-large payload is reported by its size, not printed.
	err := backendkit.CheckOutboxEntry(ctx, "outbox add", ok, "t", make([]byte, 2<<20))
	if err == nil || len(err.Error()) > 200 || !strings.Contains(err.Error(), "2097152 bytes") {
		t.Errorf("oversized payload: %v", err)
	}
}

func TestCheckRelay(t *testing.T) {
	var ae *leasecore.ArgError
	if err := backendkit.CheckRelay(context.Background(), "relay", nil); !errors.As(err, &ae) || ae.Field != "deliver" {
		t.Errorf("nil deliver: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	deliver := func(context.Context, leasecore.OutboxEntry) error { return nil }
	if err := backendkit.CheckRelay(ctx, "relay", deliver); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if err := backendkit.CheckRelay(context.Background(), "relay", deliver); err != nil {
		t.Error(err)
	}
}
