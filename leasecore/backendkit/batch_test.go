package backendkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

func TestCheckBatch(t *testing.T) {
	ok := leasecore.Batch{Scope: "daily-report", Writer: "holder-a", Token: 1,
		Parts: []leasecore.PartContent{{Part: "summary", Content: "s"}, {Part: "detail", Content: "d"}}}
	half := strings.Repeat("x", backendkit.MaxContentLen/2+1)
	many := make([]leasecore.PartContent, backendkit.MaxBatchParts+1)
	for i := range many {
		many[i] = leasecore.PartContent{Part: "p" + strings.Repeat("x", i)}
	}
	for _, tc := range []struct {
		name, field string
		edit        func(*leasecore.Batch)
	}{
		{"empty scope", "scope", func(b *leasecore.Batch) { b.Scope = "" }},
		{"writer with NUL", "writer", func(b *leasecore.Batch) { b.Writer = "a\x00b" }},
		{"token 0", "token", func(b *leasecore.Batch) { b.Token = 0 }},
		{"no parts", "parts", func(b *leasecore.Batch) { b.Parts = nil }},
		{"too many parts", "parts", func(b *leasecore.Batch) { b.Parts = many }},
		{"blank part name", "parts[1].part", func(b *leasecore.Batch) { b.Parts[1].Part = "  " }},
		{"duplicate part", "parts[1].part", func(b *leasecore.Batch) { b.Parts[1].Part = "summary" }},
		{"NUL content", "parts[0].content", func(b *leasecore.Batch) { b.Parts[0].Content = "\x00" }},
		{"too much content together", "parts", func(b *leasecore.Batch) { b.Parts[0].Content, b.Parts[1].Content = half, half }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := ok
			b.Parts = append([]leasecore.PartContent(nil), ok.Parts...)
			tc.edit(&b)
			err := backendkit.CheckBatch(context.Background(), b)
			var ae *leasecore.ArgError
			if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != tc.field {
				t.Fatalf("CheckBatch = %v, want an ArgError on field %q", err, tc.field)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("message %q does not name %q", err, tc.field)
			}
		})
	}
	if err := backendkit.CheckBatch(context.Background(), ok); err != nil {
		t.Fatalf("valid batch: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := backendkit.CheckBatch(ctx, ok); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

func TestCheckRenewAll(t *testing.T) {
	g := func(name, holder string) leasecore.Grant {
		return leasecore.Grant{Name: name, Holder: holder, Token: 1, TTL: time.Second}
	}
	for _, tc := range []struct {
		name, field string
		gs          []leasecore.Grant
	}{
		{"none", "grants", nil},
		{"two holders", "grants[1].holder", []leasecore.Grant{g("a", "h1"), g("b", "h2")}},
		{"repeated name", "grants[1].name", []leasecore.Grant{g("a", "h1"), g("a", "h1")}},
		{"bad token", "grants[1].token", []leasecore.Grant{g("a", "h1"), {Name: "b", Holder: "h1", TTL: time.Second}}},
		{"bad ttl", "grants[0].ttl", []leasecore.Grant{{Name: "a", Holder: "h1", Token: 1}}},
		{"bad ttl later", "grants[2].ttl", []leasecore.Grant{g("a", "h1"), g("b", "h1"), {Name: "c", Holder: "h1", Token: 1}}},
		{"bad name later", "grants[2].name", []leasecore.Grant{g("a", "h1"), g("b", "h1"), g("c\x00", "h1")}},
		{"bad holder later", "grants[1].holder", []leasecore.Grant{g("a", "h1"), g("b", " h1")}},
		{"bad space later", "grants[2].space", []leasecore.Grant{
			{Name: "a", Holder: "h1", Token: 1, TTL: time.Second, Space: "s"},
			{Name: "b", Holder: "h1", Token: 1, TTL: time.Second, Space: "s"},
			{Name: "c", Holder: "h1", Token: 1, TTL: time.Second, Space: "s\x00"}}},
		{"repeated name later", "grants[3].name", []leasecore.Grant{g("a", "h1"), g("b", "h1"), g("c", "h1"), g("b", "h1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := backendkit.CheckRenewAll(context.Background(), tc.gs, time.Millisecond)
			var ae *leasecore.ArgError
			if !errors.As(err, &ae) || ae.Field != tc.field || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("CheckRenewAll = %v, want an ArgError on field %q", err, tc.field)
			}
			if tc.name == "repeated name later" && !strings.Contains(err.Error(), "repeats grants[1]") {
				t.Fatalf("CheckRenewAll = %v, want it to name grants[1]", err)
			}
		})
	}
	many := make([]leasecore.Grant, 100)
	for i := range many {
		many[i] = leasecore.Grant{Name: fmt.Sprintf("shard-%03d", i), Holder: "h1", Token: leasecore.Token(i + 1), TTL: time.Second, Space: "s"}
	}
	if err := backendkit.CheckRenewAll(context.Background(), many, time.Millisecond); err != nil {
		t.Fatalf("100 valid grants: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := backendkit.CheckRenewAll(ctx, many, time.Millisecond); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

// BenchmarkCheckRenewAll is a holder's renewal of 100 names: run on every
// RenewAll, every renew interval.
func BenchmarkCheckRenewAll(b *testing.B) {
	gs := make([]leasecore.Grant, 100)
	for i := range gs {
		gs[i] = leasecore.Grant{Name: fmt.Sprintf("holder-0042/shard-%03d", i), Holder: "holder-0042", Token: leasecore.Token(i + 1),
			TTL: 15 * time.Second, Space: "etcd:cluster-id"}
	}
	ctx := context.Background()
	for b.Loop() {
		if err := backendkit.CheckRenewAll(ctx, gs, time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

func TestCheckAcquireAll(t *testing.T) {
	ctx := context.Background()
	tooMany := shardNames(backendkit.MaxAcquireAll + 1)
	for _, tc := range []struct {
		name, field string
		names       []string
		holder      string
		ttl         time.Duration
	}{
		{"no names", "names", nil, "holder-a", time.Second},
		{"too many names", "names", tooMany, "holder-a", time.Second},
		{"empty name", "names[1]", []string{"a", ""}, "holder-a", time.Second},
		{"name with NUL", "names[0]", []string{"a\x00b"}, "holder-a", time.Second},
		{"name with surrounding space", "names[2]", []string{"a", "b", " c"}, "holder-a", time.Second},
		{"repeated name", "names[2]", []string{"a", "b", "a"}, "holder-a", time.Second},
		{"bad holder", "holder", []string{"a"}, "", time.Second},
		{"ttl below the minimum", "ttl", []string{"a"}, "holder-a", time.Microsecond},
		{"ttl too long", "ttl", []string{"a"}, "holder-a", backendkit.MaxTTL + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := backendkit.CheckAcquireAll(ctx, tc.names, tc.holder, tc.ttl, time.Millisecond)
			testcheck.WantArgError(t, err, "acquire all", tc.field)
		})
	}
	if err := backendkit.CheckAcquireAll(ctx, shardNames(backendkit.MaxAcquireAll), "holder-a", time.Second, time.Millisecond); err != nil {
		t.Fatalf("MaxAcquireAll names: %v", err)
	}
	err := backendkit.CheckAcquireAll(ctx, []string{"a", "a"}, "holder-a", time.Second, 0)
	if !strings.Contains(err.Error(), "repeats names[0]") {
		t.Errorf("repeated name: %q does not say which it repeats", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := backendkit.CheckAcquireAll(cctx, []string{"a"}, "holder-a", time.Second, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

func shardNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("shard-%d", i)
	}
	return names
}
