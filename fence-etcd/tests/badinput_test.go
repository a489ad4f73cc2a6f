package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// resource is what every fenced or control resource offers.
type resource interface {
	leasecore.FencedResource
	backendkit.ResourceReader
}

type namedResource struct {
	name string
	r    resource
}

// stores are every public entry point on one client and prefix.
type stores struct {
	leases    *fenceetcd.LeaseStore
	fence     *fenceetcd.Fence
	resources []namedResource // the fenced resource and each control
}

func newStores(t *testing.T, cli *clientv3.Client, prefix string) stores {
	t.Helper()
	opt := fenceetcd.WithPrefix(prefix)
	var s stores
	var err error
	if s.leases, err = fenceetcd.NewLeaseStore(cli, opt); err != nil {
		t.Fatal(err)
	}
	if s.fence, err = fenceetcd.NewFence(cli, opt, logAll); err != nil {
		t.Fatal(err)
	}
	res, err := fenceetcd.NewResource(cli, opt, logAll)
	if err != nil {
		t.Fatal(err)
	}
	controls, err := etcdcontrol.New(cli, opt)
	if err != nil {
		t.Fatal(err)
	}
	s.resources = []namedResource{
		{"fenced", res},
		{"unfenced", controls.Unfenced()},
		{"check-then-write", controls.CheckThenWrite(nil)},
		{"row-fenced", controls.RowFenced()},
		{"publisher", controls.IdempotentPublisher()},
	}
	return s
}

// badCalls returns the bad-input rows of conformance case X1 for every
// public entry point on s: the lease store (RenewAll included) and the
// fenced resource (WriteBatch included), and each negative control (which
// the suite does not see). X1 judges "nothing changed" by what the readers
// show; TestBadInput runs the same rows against every key under the
// prefix, and against an endpoint nobody listens on. Only fenceetcd has the
// rest: TTLs that are not a whole number of seconds, and which of its TTL
// checks speaks first (etcdReasons). grant is a valid grant of s.leases.
func badCalls(t *testing.T, s stores, grant leasecore.Grant) []conformance.BadCall {
	t.Helper()
	okWrite := leasecore.Write{Scope: "daily-report", Part: "summary", Content: "x", Writer: "holder-a", Token: 1}
	calls := conformance.BadInputCalls(conformance.BadInput{
		Lease: s.leases, Grant: grant, Free: "lease-new",
		Resource: s.resources[0].r, Write: okWrite, SecondPart: "detail",
		MinTTL: fenceetcd.MinTTL, TTLGranularity: time.Second,
	})
	used := map[string]bool{}
	for i, c := range calls {
		if r, ok := etcdReasons[c.Name]; ok {
			calls[i].Reason, used[c.Name] = r, true
		}
	}
	for name := range etcdReasons {
		if !used[name] {
			t.Fatalf("conformance.BadInputCalls has no row %q any more", name)
		}
	}
	// AcquireQueued validates as Acquire does: the same rows, through it.
	for _, c := range conformance.BadInputCalls(conformance.BadInput{
		Lease: queuedAcquire{s.leases}, Grant: grant, Free: "lease-new", MinTTL: fenceetcd.MinTTL, TTLGranularity: time.Second,
	}) {
		if name, ok := strings.CutPrefix(c.Name, "acquire "); ok && !strings.HasPrefix(name, "all") {
			if r, ok := etcdReasons[c.Name]; ok {
				c.Reason = r
			}
			c.Name = "acquire queued " + name
			calls = append(calls, c)
		}
	}
	for _, nr := range s.resources[1:] { // the controls
		for _, c := range conformance.BadInputCalls(conformance.BadInput{Resource: nr.r, Write: okWrite}) {
			c.Name = nr.name + " " + c.Name
			calls = append(calls, c)
		}
	}

	add := func(name, mention string, call func(ctx context.Context) error) {
		calls = append(calls, conformance.BadCall{Group: "ttl", Name: name, Want: leasecore.ErrInvalidArgument,
			Mention: mention, Reason: "whole number of seconds", Call: call})
	}
	for _, ttl := range []struct {
		label string
		d     time.Duration
	}{{"not whole seconds", 1500 * time.Millisecond}, {"a nanosecond over", time.Minute + time.Nanosecond}} {
		g := grant
		g.TTL = ttl.d
		add("acquire ttl "+ttl.label, "ttl", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, "lease-new", "holder-a", ttl.d)
			return err
		})
		add("acquire queued ttl "+ttl.label, "ttl", func(ctx context.Context) error {
			_, err := s.leases.AcquireQueued(ctx, "lease-new", "holder-a", ttl.d)
			return err
		})
		add("renew ttl "+ttl.label, "ttl", func(ctx context.Context) error { _, err := s.leases.Renew(ctx, g); return err })
		add("release ttl "+ttl.label, "ttl", func(ctx context.Context) error { return s.leases.Release(ctx, g) })
	}
	second := grant
	second.Name, second.TTL = "held-lease-2", 1500*time.Millisecond
	add("renew all ttl not whole seconds", "grants[1].ttl", func(ctx context.Context) error {
		_, _, err := s.leases.RenewAll(ctx, []leasecore.Grant{grant, second})
		return err
	})
	return calls
}

// queuedAcquire is a LeaseStore whose Acquire is its AcquireQueued, for
// the rows of conformance.BadInputCalls that acquire.
type queuedAcquire struct{ *fenceetcd.LeaseStore }

func (q queuedAcquire) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	return q.AcquireQueued(ctx, name, holder, ttl)
}

// etcdReasons are rows of conformance.BadInputCalls whose message this test
// checks beyond the field X1 checks: on etcd, the bounds of a TTL are
// checked before its whole seconds, and leasecore's reasons for a batch
// and a renew-all reach the caller unchanged.
var etcdReasons = map[string]string{
	"acquire ttl below MinTTL":                      "minimum",
	"renew ttl below MinTTL":                        "minimum",
	"release ttl below MinTTL":                      "minimum",
	"acquire ttl above MaxTTL":                      "maximum",
	"renew ttl above MaxTTL":                        "maximum",
	"release ttl above MaxTTL":                      "maximum",
	"acquire ttl MaxInt64":                          "maximum",
	"renew ttl MaxInt64":                            "maximum",
	"release ttl MaxInt64":                          "maximum",
	"write batch no parts":                          "1 to 64 parts",
	"write batch too many parts":                    "1 to 64 parts",
	"write batch repeated part":                     "repeats parts[0]",
	"write batch content over MaxContentLen in all": "all parts together",
	"renew all no grants":                           "1 to 10000 grants",
	"renew all too many grants":                     "1 to 10000 grants",
	"renew all repeated name":                       "repeats grants[0]",
}

// TestBadInput: every public entry point rejects bad input and a cancelled
// context with the right sentinel and a message naming the field, and
// everything under the prefix is exactly as before; renew and release of a
// holding period that is not current fail with ErrLost and change nothing
// either.
func TestBadInput(t *testing.T) {
	t.Run("constructors", func(t *testing.T) {
		cli := newFixture(t).cli
		type ctor struct {
			name string
			call func(*clientv3.Client, ...fenceetcd.Option) error
		}
		ctors := []ctor{
			{"NewLeaseStore", func(c *clientv3.Client, o ...fenceetcd.Option) error {
				_, err := fenceetcd.NewLeaseStore(c, o...)
				return err
			}},
			{"NewResource", func(c *clientv3.Client, o ...fenceetcd.Option) error {
				_, err := fenceetcd.NewResource(c, o...)
				return err
			}},
			{"NewFence", func(c *clientv3.Client, o ...fenceetcd.Option) error {
				_, err := fenceetcd.NewFence(c, o...)
				return err
			}},
			{"etcdcontrol.New", func(c *clientv3.Client, o ...fenceetcd.Option) error {
				_, err := etcdcontrol.New(c, o...)
				return err
			}},
		}
		wantArg := func(t *testing.T, what string, err error, field, mention string) {
			t.Helper()
			var ae *leasecore.ArgError
			if !errors.As(err, &ae) || !errors.Is(err, leasecore.ErrInvalidArgument) || ae.Field != field ||
				!strings.Contains(err.Error(), mention) {
				t.Errorf("%s: got %v, want a *leasecore.ArgError for field %q mentioning %q", what, err, field, mention)
			}
		}
		for _, c := range ctors {
			wantArg(t, c.name+"(nil)", c.call(nil), "client", "client")
			for _, p := range []struct{ prefix, mention string }{
				{"", "must not be empty"},
				{"leasefence", `must begin with "/"`},
				{"/leasefence/", `must not end with "/"`},
				{"/", `must not end with "/"`},
				{"/lease\nfence", "control character"},
				{"/" + strings.Repeat("p", backendkit.MaxNameLen), "longer than"},
			} {
				wantArg(t, c.name+" prefix "+p.prefix, c.call(cli, fenceetcd.WithPrefix(p.prefix)), "prefix", p.mention)
			}
			if err := c.call(cli); err != nil {
				t.Errorf("%s with the default prefix: %v", c.name, err)
			}
			// The attempt log mode is checked by every constructor that
			// takes options, also those that ignore it.
			wantArg(t, c.name+" attempt log 7", c.call(cli, fenceetcd.WithAttemptLog(7)), "attempt log", "LogRejected, LogAll or LogNone")
			for _, m := range []leasecore.AttemptLog{leasecore.LogRejected, leasecore.LogAll, leasecore.LogNone} {
				if err := c.call(cli, fenceetcd.WithAttemptLog(m)); err != nil {
					t.Errorf("%s with attempt log %v: %v", c.name, m, err)
				}
			}
			if err := c.call(cli, fenceetcd.WithPrefix("/x"), fenceetcd.WithPrefix("/y/z")); err != nil {
				t.Errorf("%s with a valid prefix: %v", c.name, err)
			}
		}
	})

	f := newFixture(t)
	s := newStores(t, f.cli, f.prefix)
	ctx := context.Background()

	// Something under every kind of key, so "nothing changed" means
	// something.
	held, err := s.leases.Acquire(ctx, "held-lease", "holder-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired, err := s.leases.Acquire(ctx, "expired-lease", "holder-a", fenceetcd.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	released, err := s.leases.Acquire(ctx, "released-lease", "holder-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.leases.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	waitGone(t, f, expired.Name)
	for _, nr := range s.resources {
		backendtest.Write(t, nr.r, "daily-report", "summary", "by "+nr.name, "holder-a", 1)
	}
	before := f.snapshot(t)
	for _, kind := range []string{"/lease/", "/floor/", "/part/", "/attempt/", "/parttoken/", "/published/"} {
		if !strings.Contains(before, kind) {
			t.Fatalf("no %s key to watch:\n%s", kind, before)
		}
	}

	check := func(t *testing.T, c conformance.BadCall) {
		if err := c.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if after := f.snapshot(t); after != before {
			old := before
			before = after // report each change once, not in every later case
			t.Fatalf("keys changed:\nbefore:\n%s\nafter:\n%s", old, after)
		}
	}
	for _, c := range badCalls(t, s, held) {
		t.Run(c.Name, func(t *testing.T) { check(t, c) })
	}
	for _, c := range fenceBadCalls(s.fence, f.prefix) {
		t.Run(c.Name, func(t *testing.T) { check(t, c) })
	}
	for _, c := range fenceRefusedCalls(s.fence, f.prefix) {
		t.Run(c.Name, func(t *testing.T) { check(t, c) })
	}

	lost := leasecore.ErrLost
	stranger := held
	stranger.Holder = "holder-x"
	const gone = "no such lease (expired or released)"
	hold := func(name string, want error, mention string, call func(ctx context.Context) error) conformance.BadCall {
		return conformance.BadCall{Name: name, Want: want, Mention: mention, Call: call}
	}
	for _, c := range []conformance.BadCall{
		hold("acquire while held", leasecore.ErrHeld, "held", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, held.Name, "holder-b", time.Minute)
			return err
		}),
		hold("renew by non-holder", lost, `holder "holder-x" does not hold it`,
			func(ctx context.Context) error { _, err := s.leases.Renew(ctx, stranger); return err }),
		hold("release by non-holder", lost, `holder "holder-x" does not hold it`,
			func(ctx context.Context) error { return s.leases.Release(ctx, stranger) }),
		hold("renew after expiry", lost, gone,
			func(ctx context.Context) error { _, err := s.leases.Renew(ctx, expired); return err }),
		hold("release after expiry", lost, gone,
			func(ctx context.Context) error { return s.leases.Release(ctx, expired) }),
		hold("release twice", lost, gone,
			func(ctx context.Context) error { return s.leases.Release(ctx, released) }),
		hold("renew after release", lost, gone,
			func(ctx context.Context) error { _, err := s.leases.Renew(ctx, released); return err }),
	} {
		t.Run(c.Name, func(t *testing.T) { check(t, c) })
	}

	// The same calls against an endpoint nobody listens on fail the same
	// way and at once: the input is rejected before anything is sent.
	t.Run("nothing sent", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()}) // connects lazily
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		grant := leasecore.Grant{Name: "held-lease", Holder: "holder-a", Token: 1, TTL: time.Hour}
		nothing := newStores(t, cli, "/nothing")
		for _, c := range append(badCalls(t, nothing, grant), fenceBadCalls(nothing.fence, "/nothing")...) {
			// A call that did send would wait for the connection until
			// this deadline and fail with it instead.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := c.Run(ctx); err != nil {
				t.Errorf("%s: %v", c.Name, err)
			}
			cancel()
		}
	})
}

// TestNamesAreData: names with slashes, percent signs, spaces and
// non-ASCII text are stored and read back verbatim, each under its own key.
func TestNamesAreData(t *testing.T) {
	f := newFixture(t)
	s := newStores(t, f.cli, f.prefix)
	ctx := context.Background()
	values := []string{`a/b`, `a`, `a%2Fb`, `../..`, `%`, `\`, `*`, `日报 summary`, `' OR '1'='1`}
	for i, v := range values {
		g, err := s.leases.Acquire(ctx, v, v, time.Hour)
		if err != nil || g.Name != v || g.Holder != v {
			t.Fatalf("acquire %q: %+v, %v", v, g, err)
		}
		st, err := s.leases.Inspect(ctx, v)
		if err != nil || !st.Exists || st.Holder != v || st.Token != g.Token {
			t.Fatalf("inspect %q: %+v, %v", v, st, err)
		}
		if g, err = s.leases.Renew(ctx, g); err != nil {
			t.Fatalf("renew %q: %v", v, err)
		}
		if err := s.leases.Release(ctx, g); err != nil {
			t.Fatalf("release %q: %v", v, err)
		}
		for _, nr := range s.resources {
			res := backendtest.Write(t, nr.r, v, v, v, v, leasecore.Token(i+1))
			if !res.Accepted {
				t.Fatalf("%s: write %q: %+v", nr.name, v, res)
			}
			backendtest.WantPart(t, nr.r, v, v, v, v, leasecore.Token(i+1))
			as, err := nr.r.Attempts(ctx, v)
			if err != nil || len(as) == 0 || as[len(as)-1].Writer != v || as[len(as)-1].Part != v {
				t.Fatalf("%s: attempts of %q: %+v, %v", nr.name, v, as, err)
			}
		}
		backendtest.WantFloor(t, s.resources[0].r, v, leasecore.Token(i+1))
	}
	// One floor, part, parttoken and publication per name, and one attempt
	// per write: no two names shared a key.
	snap := f.snapshot(t)
	for kind, want := range map[string]int{"/floor/": len(values), "/part/": len(values), "/parttoken/": len(values),
		"/published/": len(values), "/attempt/": len(values) * len(s.resources), "/lease/": 0} {
		if got := strings.Count(snap, f.prefix+kind); got != want {
			t.Errorf("%d %s keys, want %d:\n%s", got, kind, want, snap)
		}
	}
}

// fenceBadCalls are the bad-input rows of the Fence's entry points: each
// must fail before anything is sent, with an error naming the field (or the
// context's error), and write nothing. prefix is the fence's key prefix.
func fenceBadCalls(f *fenceetcd.Fence, prefix string) []conformance.BadCall {
	ok := leasecore.Claim{Scope: "daily-report", Writer: "holder-a", Token: 1}
	own := fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut("/own/row", "x")}}
	var calls []conformance.BadCall
	add := func(name string, want error, mention, reason string, call func(ctx context.Context) error) {
		calls = append(calls, conformance.BadCall{Group: "fence", Name: name, Want: want, Mention: mention,
			Reason: reason, Call: call})
	}
	arg := leasecore.ErrInvalidArgument
	cancelled := func(call func(ctx context.Context) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return call(ctx)
		}
	}
	long := strings.Repeat("s", backendkit.MaxNameLen+1)
	claims := []struct {
		name, mention string
		c             leasecore.Claim
	}{
		{"empty scope", "scope", leasecore.Claim{Writer: "holder-a", Token: 1}},
		{"overlong scope", "scope", leasecore.Claim{Scope: long, Writer: "holder-a", Token: 1}},
		{"scope with NUL", "scope", leasecore.Claim{Scope: "a\x00b", Writer: "holder-a", Token: 1}},
		{"empty writer", "writer", leasecore.Claim{Scope: "daily-report", Token: 1}},
		{"overlong writer", "writer", leasecore.Claim{Scope: "daily-report", Writer: long, Token: 1}},
		{"token 0", "token", leasecore.Claim{Scope: "daily-report", Writer: "holder-a"}},
		{"token above MaxToken", "token", leasecore.Claim{Scope: "daily-report", Writer: "holder-a", Token: backendkit.MaxToken + 1}},
	}
	for _, c := range claims {
		add("advance "+c.name, arg, c.mention, "", func(ctx context.Context) error { _, err := f.Advance(ctx, c.c); return err })
		add("commit "+c.name, arg, c.mention, "", func(ctx context.Context) error { _, _, err := f.Commit(ctx, c.c, own); return err })
	}
	add("advance cancelled context", context.Canceled, "context canceled", "",
		cancelled(func(ctx context.Context) error { _, err := f.Advance(ctx, ok); return err }))
	add("commit cancelled context", context.Canceled, "context canceled", "",
		cancelled(func(ctx context.Context) error { _, _, err := f.Commit(ctx, ok, own); return err }))

	// A caller's transaction must not write the fence's own keys.
	floorKey := prefix + "/floor/daily-report"
	for _, tc := range []struct {
		name, mention string
		t             fenceetcd.Txn
	}{
		{"puts the floor", "then[1]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut("/own/row", "x"),
			clientv3.OpPut(floorKey, "99999999999999999999")}}},
		{"deletes the floor in else", "else[0]", fenceetcd.Txn{Else: []clientv3.Op{clientv3.OpDelete(floorKey)}}},
		{"puts an attempt key", "then[0]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(prefix+"/attempt/daily-report/x", "{}")}}},
		{"deletes every floor", "then[0]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpDelete(prefix+"/floor/", clientv3.WithPrefix())}}},
		{"deletes the whole prefix", "then[0]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpDelete(prefix+"/", clientv3.WithPrefix())}}},
		{"deletes from a key on", "then[0]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpDelete(prefix+"/a", clientv3.WithFromKey())}}},
		{"deletes a range across the floors", "then[0]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpDelete(prefix+"/e", clientv3.WithRange(prefix+"/g"))}}},
		{"nested put of the floor", "then[0].else[1]", fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpTxn(nil, nil,
			[]clientv3.Op{clientv3.OpGet(floorKey), clientv3.OpPut(floorKey, "x")})}}},
	} {
		add("commit txn "+tc.name, arg, tc.mention, "writes a key of the fence", func(ctx context.Context) error {
			_, _, err := f.Commit(ctx, ok, tc.t)
			return err
		})
	}

	attempts := func(q leasecore.AttemptQuery) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.Attempts(ctx, q); return err }
	}
	add("attempts empty scope", arg, "scope", "", attempts(leasecore.AttemptQuery{Limit: 10}))
	add("attempts overlong scope", arg, "scope", "", attempts(leasecore.AttemptQuery{Scope: long, Limit: 10}))
	add("attempts limit 0", arg, "limit", "", attempts(leasecore.AttemptQuery{Scope: "daily-report"}))
	add("attempts limit -1", arg, "limit", "", attempts(leasecore.AttemptQuery{Scope: "daily-report", Limit: -1}))
	add("attempts limit above MaxAttemptsRead", arg, "limit", "",
		attempts(leasecore.AttemptQuery{Scope: "daily-report", Limit: backendkit.MaxAttemptsRead + 1}))
	add("attempts cancelled context", context.Canceled, "context canceled", "",
		cancelled(attempts(leasecore.AttemptQuery{Scope: "daily-report", Limit: 10})))

	prune := func(scope string, before time.Time) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.PruneAttempts(ctx, scope, before); return err }
	}
	add("prune attempts empty scope", arg, "scope", "", prune("", time.Now()))
	add("prune attempts overlong scope", arg, "scope", "", prune(long, time.Now()))
	add("prune attempts zero bound", arg, "before", "must be set", prune("daily-report", time.Time{}))
	add("prune attempts future bound", arg, "before", "in the future", prune("daily-report", time.Now().Add(time.Hour)))
	add("prune attempts cancelled context", context.Canceled, "context canceled", "", cancelled(prune("daily-report", time.Now())))
	return calls
}

// fenceRefusedCalls are caller transactions that pass the fence's own
// checks but that etcd refuses as a whole, before applying any of it:
// Commit must report them as ErrInvalidArgument, and nothing is written
// (no advance either: the first request is refused already).
func fenceRefusedCalls(f *fenceetcd.Fence, prefix string) []conformance.BadCall {
	newScope := leasecore.Claim{Scope: "never-written", Writer: "holder-a", Token: 7}
	var many []clientv3.Op
	for i := range 200 {
		many = append(many, clientv3.OpPut(fmt.Sprintf("%s/own/%03d", prefix, i), "x"))
	}
	var calls []conformance.BadCall
	for _, tc := range []struct {
		name, reason string
		t            fenceetcd.Txn
	}{
		{"200 operations", "too many operations", fenceetcd.Txn{Then: many}},
		{"a key put twice", "duplicate key", fenceetcd.Txn{Then: []clientv3.Op{
			clientv3.OpPut(prefix+"/own/a", "1"), clientv3.OpPut(prefix+"/own/a", "2")}}},
		{"a compare without a key", "key is not provided", fenceetcd.Txn{
			If: []clientv3.Cmp{clientv3.Compare(clientv3.Value(""), "=", "x")}}},
	} {
		calls = append(calls, conformance.BadCall{Group: "fence", Name: "commit refused by etcd: " + tc.name,
			Want: leasecore.ErrInvalidArgument, Mention: "commit", Reason: tc.reason,
			Call: func(ctx context.Context) error {
				for _, c := range []leasecore.Claim{newScope, {Scope: "daily-report", Writer: "holder-a", Token: 1}} {
					if _, _, err := f.Commit(ctx, c, tc.t); err == nil || !errors.Is(err, leasecore.ErrInvalidArgument) {
						return err
					}
				}
				_, _, err := f.Commit(ctx, newScope, tc.t)
				return err
			}})
	}
	return calls
}
