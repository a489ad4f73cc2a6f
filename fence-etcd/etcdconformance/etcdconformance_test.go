package etcdconformance

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
)

func TestTraits(t *testing.T) {
	crash := func(context.Context) (string, time.Duration, error) { return "", 0, nil }
	for _, c := range []struct {
		cfg    Config
		absent []conformance.Ability
	}{
		{Config{Endpoints: []string{"x"}, HolderArgs: []string{"-test.run=^$"}, Crash: crash},
			[]conformance.Ability{conformance.AbilityLongTransaction, conformance.AbilityCommitGap, conformance.AbilityLockWaitProbe, conformance.AbilityReplicas,
				conformance.AbilityCheckFirst}},
		{Config{Endpoints: []string{"x"}},
			[]conformance.Ability{conformance.AbilityLongTransaction, conformance.AbilityCommitGap, conformance.AbilityLockWaitProbe,
				conformance.AbilityHolderProcesses, conformance.AbilityCrashRestart, conformance.AbilityReplicas, conformance.AbilityCheckFirst}},
	} {
		h, err := New(c.cfg)(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tr := h.Traits()
		if tr.Name != "etcd" || tr.MinTTL != time.Second || tr.TTLGranularity != time.Second || tr.TokenStep != 0 {
			t.Fatalf("traits: %+v", tr)
		}
		var got []conformance.Ability
		for ab, reason := range tr.Absent {
			if reason == "" {
				t.Errorf("%s declared absent without a reason", ab)
			}
			got = append(got, ab)
		}
		slices.Sort(got)
		slices.Sort(c.absent)
		if !slices.Equal(got, c.absent) {
			t.Errorf("absent %v, want %v", got, c.absent)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFreshPrefixes: every harness has its own prefix, and its holder
// processes are told the same one.
func TestFreshPrefixes(t *testing.T) {
	newH := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, HolderArgs: []string{"-test.run=^$"}})
	seen := map[string]bool{}
	for range 20 {
		ch, err := newH(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		h := ch.(*harness)
		if !regexp.MustCompile(`^/leasefence-test/[0-9a-f]{16}$`).MatchString(h.prefix) || seen[h.prefix] {
			t.Fatalf("prefix %q: not fresh or not /leasefence-test/<16 hex>", h.prefix)
		}
		seen[h.prefix] = true
		cmd, err := h.HolderCommand(context.Background(), conformance.KindUnfenced)
		if err != nil {
			t.Fatal(err)
		}
		var spec holderSpec
		for _, e := range cmd.Env {
			if v, ok := strings.CutPrefix(e, HolderEnv+"="); ok {
				if err := json.Unmarshal([]byte(v), &spec); err != nil {
					t.Fatal(err)
				}
			}
		}
		if spec.Prefix != h.prefix || spec.Kind != conformance.KindUnfenced || !slices.Equal(spec.Endpoints, h.cfg.Endpoints) ||
			!slices.Equal(cmd.Args[1:], []string{"-test.run=^$"}) {
			t.Fatalf("holder spec %+v, args %q; harness prefix %q", spec, cmd.Args, h.prefix)
		}
	}
	// The lease mode travels with the spec: holders use the harness's.
	for _, shared := range []bool{false, true} {
		ch, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, HolderArgs: []string{"-test.run=^$"},
			SharedLeases: shared})(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if name := ch.Traits().Name; (name == "etcd/shared-leases") != shared {
			t.Errorf("SharedLeases=%v: traits name %q", shared, name)
		}
		cmd, err := ch.(*harness).HolderCommand(context.Background(), conformance.KindFenced)
		if err != nil {
			t.Fatal(err)
		}
		var spec holderSpec
		for _, e := range cmd.Env {
			if v, ok := strings.CutPrefix(e, HolderEnv+"="); ok {
				if err := json.Unmarshal([]byte(v), &spec); err != nil {
					t.Fatal(err)
				}
			}
		}
		if spec.SharedLeases != shared || spec.Prefix != ch.(*harness).prefix {
			t.Errorf("SharedLeases=%v: holder spec %+v", shared, spec)
		}
	}
	h, _ := newH(context.Background())
	if _, err := h.(*harness).HolderCommand(context.Background(), "other"); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Fatalf("unknown kind: %v", err)
	}
	if _, err := New(Config{})(context.Background()); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Fatalf("no endpoints: %v", err)
	}
}

// TestUserDataShape: the holder kinds of the user data are accepted, the
// fenced user resource has no Prepare (its PREPARE answers "none") and the
// marker-first control has one, user keys of different (scope, part)
// pairs never collide, and a commit gap, which no etcd Txn can hold, is
// refused rather than ignored.
func TestUserDataShape(t *testing.T) {
	ch, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, HolderArgs: []string{"-test.run=^$"}})(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := ch.(*harness)
	for _, kind := range []conformance.ResourceKind{conformance.KindUserData, conformance.KindMarkerFirst} {
		if _, err := h.HolderCommand(context.Background(), kind); err != nil {
			t.Errorf("holder command for %q: %v", kind, err)
		}
	}
	if _, ok := any(&userResource{}).(conformance.Preparer); ok {
		t.Error("the fenced user resource implements conformance.Preparer: F4u's PREPARE would not answer none")
	}
	if _, ok := any(&markerFirst{}).(conformance.Preparer); !ok {
		t.Error("the marker-first control does not implement conformance.Preparer")
	}
	seen := map[string][2]string{}
	for _, sp := range [][2]string{{"a", "b/c"}, {"a/b", "c"}, {"a%2Fb", "c"}, {"a", "b%2Fc"}, {"a", "b"}, {"b", "a"}} {
		for _, table := range userTables {
			k := userKey(h.prefix, table, sp[0], sp[1])
			if prev, dup := seen[k]; dup {
				t.Errorf("scope/part %q and %q share the key %q", prev, sp, k)
			}
			seen[k] = sp
		}
	}
	gap := func(context.Context, leasecore.Write) error { return nil }
	if _, err := h.UserDataResource(context.Background(), gap); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("user data resource with a gap: %v, want ErrInvalidArgument", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
}
