package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/leasecore"
)

// resource is what every fenced or control resource offers.
type resource interface {
	leasecore.FencedResource
	leasecore.ResourceReader
}

type namedResource struct {
	name string
	r    resource
}

// stores are every public entry point on one client and prefix.
type stores struct {
	leases    *fenceetcd.LeaseStore
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
	res, err := fenceetcd.NewResource(cli, opt)
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

// badCase is one call that must fail with an error wrapping want whose
// message mentions mention, and change nothing.
type badCase struct {
	name    string
	call    func(ctx context.Context) error
	want    error
	mention string
}

// The bad identifiers, for every name, holder, scope, part and writer.
var badNames = []struct{ label, v string }{
	{"empty", ""},
	{"whitespace only", " \t "},
	{"leading space", " holder-a"},
	{"trailing space", "holder-a "},
	{"over-long", strings.Repeat("n", leasecore.MaxNameLen+1)},
	{"NUL", "holder\x00a"},
	{"control character", "holder\na"},
	{"invalid UTF-8", "holder\xffa"},
}

// validationCases are the calls whose input is rejected before anything is
// sent: bad identifiers, TTLs (non-whole seconds included), tokens and
// contents on every entry point, and an already-cancelled context. grant is
// a grant the store issued.
func validationCases(s stores, grant leasecore.Grant) []badCase {
	var cases []badCase
	add := func(name string, want error, mention string, call func(ctx context.Context) error) {
		cases = append(cases, badCase{name, call, want, mention})
	}
	inv := leasecore.ErrInvalidArgument
	okWrite := leasecore.Write{Scope: "daily-report", Part: "summary", Content: "x", Writer: "holder-a", Token: 1}
	with := func(f func(*leasecore.Grant)) leasecore.Grant { g := grant; f(&g); return g }
	withW := func(f func(*leasecore.Write)) leasecore.Write { w := okWrite; f(&w); return w }

	for _, b := range badNames {
		v := b.v
		add("acquire name "+b.label, inv, "name", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, v, "holder-a", time.Minute)
			return err
		})
		add("acquire holder "+b.label, inv, "holder", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, "lease-new", v, time.Minute)
			return err
		})
		for field, g := range map[string]leasecore.Grant{
			"name":   with(func(g *leasecore.Grant) { g.Name = v }),
			"holder": with(func(g *leasecore.Grant) { g.Holder = v }),
		} {
			add("renew "+field+" "+b.label, inv, field, func(ctx context.Context) error {
				_, err := s.leases.Renew(ctx, g)
				return err
			})
			add("release "+field+" "+b.label, inv, field, func(ctx context.Context) error {
				return s.leases.Release(ctx, g)
			})
		}
		add("inspect name "+b.label, inv, "name", func(ctx context.Context) error {
			_, err := s.leases.Inspect(ctx, v)
			return err
		})
		for _, nr := range s.resources {
			r := nr.r
			for field, w := range map[string]leasecore.Write{
				"scope":  withW(func(w *leasecore.Write) { w.Scope = v }),
				"part":   withW(func(w *leasecore.Write) { w.Part = v }),
				"writer": withW(func(w *leasecore.Write) { w.Writer = v }),
			} {
				add(nr.name+" write "+field+" "+b.label, inv, field, func(ctx context.Context) error {
					_, err := r.Write(ctx, w)
					return err
				})
			}
			add(nr.name+" floor scope "+b.label, inv, "scope", func(ctx context.Context) error {
				_, err := r.Floor(ctx, v)
				return err
			})
			add(nr.name+" read part scope "+b.label, inv, "scope", func(ctx context.Context) error {
				_, _, err := r.ReadPart(ctx, v, "summary")
				return err
			})
			add(nr.name+" read part part "+b.label, inv, "part", func(ctx context.Context) error {
				_, _, err := r.ReadPart(ctx, "daily-report", v)
				return err
			})
			add(nr.name+" attempts scope "+b.label, inv, "scope", func(ctx context.Context) error {
				_, err := r.Attempts(ctx, v)
				return err
			})
		}
	}

	for _, ttl := range []struct {
		label, mention string
		d              time.Duration
	}{
		{"zero", "ttl", 0}, {"negative", "ttl", -time.Second},
		{"below MinTTL", "minimum", fenceetcd.MinTTL - time.Millisecond},
		{"not whole seconds", "whole number of seconds", 1500 * time.Millisecond},
		{"a nanosecond over", "whole number of seconds", time.Minute + time.Nanosecond},
		{"above MaxTTL", "maximum", leasecore.MaxTTL + time.Second},
		{"MaxInt64", "maximum", time.Duration(math.MaxInt64)},
	} {
		g := with(func(g *leasecore.Grant) { g.TTL = ttl.d })
		add("acquire ttl "+ttl.label, inv, ttl.mention, func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, "lease-new", "holder-a", ttl.d)
			return err
		})
		add("renew ttl "+ttl.label, inv, ttl.mention, func(ctx context.Context) error {
			_, err := s.leases.Renew(ctx, g)
			return err
		})
		add("release ttl "+ttl.label, inv, ttl.mention, func(ctx context.Context) error { return s.leases.Release(ctx, g) })
	}

	for _, tok := range []struct {
		label string
		t     leasecore.Token
	}{{"zero", 0}, {"above MaxToken", leasecore.MaxToken + 1}} {
		g := with(func(g *leasecore.Grant) { g.Token = tok.t })
		add("renew token "+tok.label, inv, "token", func(ctx context.Context) error {
			_, err := s.leases.Renew(ctx, g)
			return err
		})
		add("release token "+tok.label, inv, "token", func(ctx context.Context) error { return s.leases.Release(ctx, g) })
		for _, nr := range s.resources {
			w := withW(func(w *leasecore.Write) { w.Token = tok.t })
			add(nr.name+" write token "+tok.label, inv, "token", func(ctx context.Context) error {
				_, err := nr.r.Write(ctx, w)
				return err
			})
		}
	}

	for _, c := range []struct{ label, v string }{
		{"over MaxContentLen", strings.Repeat("c", leasecore.MaxContentLen+1)},
		{"NUL", "report\x00body"},
		{"invalid UTF-8", "report\xffbody"},
	} {
		for _, nr := range s.resources {
			w := withW(func(w *leasecore.Write) { w.Content = c.v })
			add(nr.name+" write content "+c.label, inv, "content", func(ctx context.Context) error {
				_, err := nr.r.Write(ctx, w)
				return err
			})
		}
	}

	// WriteBatch of the fenced resource: identifiers, part count, distinct
	// parts, token, content of each part and of all together.
	bw := s.resources[0].r.(leasecore.BatchWriter)
	okBatch := leasecore.Batch{Scope: "daily-report", Writer: "holder-a", Token: 1,
		Parts: []leasecore.PartContent{{Part: "summary", Content: "x"}, {Part: "detail", Content: "y"}}}
	withB := func(f func(*leasecore.Batch)) leasecore.Batch {
		b := okBatch
		b.Parts = slices.Clone(okBatch.Parts)
		f(&b)
		return b
	}
	addBatch := func(label, mention string, b leasecore.Batch) {
		add("write batch "+label, inv, mention, func(ctx context.Context) error {
			_, err := bw.WriteBatch(ctx, b)
			return err
		})
	}
	for _, b := range badNames {
		v := b.v
		addBatch("scope "+b.label, "scope", withB(func(b *leasecore.Batch) { b.Scope = v }))
		addBatch("writer "+b.label, "writer", withB(func(b *leasecore.Batch) { b.Writer = v }))
		addBatch("part "+b.label, "parts[1].part", withB(func(b *leasecore.Batch) { b.Parts[1].Part = v }))
	}
	addBatch("no parts", "1 to 64 parts", withB(func(b *leasecore.Batch) { b.Parts = nil }))
	addBatch("65 parts", "1 to 64 parts", withB(func(b *leasecore.Batch) {
		b.Parts = nil
		for i := range leasecore.MaxBatchParts + 1 {
			b.Parts = append(b.Parts, leasecore.PartContent{Part: fmt.Sprint("p", i)})
		}
	}))
	addBatch("repeated part", "repeats parts[0]", withB(func(b *leasecore.Batch) { b.Parts[1].Part = b.Parts[0].Part }))
	addBatch("token zero", "token", withB(func(b *leasecore.Batch) { b.Token = 0 }))
	addBatch("token above MaxToken", "token", withB(func(b *leasecore.Batch) { b.Token = leasecore.MaxToken + 1 }))
	addBatch("content NUL", "parts[1].content", withB(func(b *leasecore.Batch) { b.Parts[1].Content = "a\x00b" }))
	addBatch("content invalid UTF-8", "parts[1].content", withB(func(b *leasecore.Batch) { b.Parts[1].Content = "a\xffb" }))
	addBatch("content over MaxContentLen in all", "all parts together", withB(func(b *leasecore.Batch) {
		b.Parts[0].Content = strings.Repeat("c", leasecore.MaxContentLen/2+1)
		b.Parts[1].Content = b.Parts[0].Content
	}))

	// RenewAll: count, one holder, distinct names, each grant valid, TTLs
	// of whole seconds.
	second := grant
	second.Name = "held-lease-2"
	withG := func(f func(*leasecore.Grant)) []leasecore.Grant {
		g := second
		f(&g)
		return []leasecore.Grant{grant, g}
	}
	addRenewAll := func(label, mention string, gs []leasecore.Grant) {
		add("renew all "+label, inv, mention, func(ctx context.Context) error {
			_, _, err := s.leases.RenewAll(ctx, gs)
			return err
		})
	}
	addRenewAll("no grants", "1 to 10000 grants", nil)
	many := make([]leasecore.Grant, leasecore.MaxRenewAll+1)
	for i := range many {
		many[i] = grant
		many[i].Name = fmt.Sprint("lease-", i)
	}
	addRenewAll("too many grants", "1 to 10000 grants", many)
	addRenewAll("two holders", "grants[1].holder", withG(func(g *leasecore.Grant) { g.Holder = "holder-b" }))
	addRenewAll("repeated name", "repeats grants[0]", withG(func(g *leasecore.Grant) { g.Name = grant.Name }))
	addRenewAll("ttl not whole seconds", "grants[1].ttl", withG(func(g *leasecore.Grant) { g.TTL = 1500 * time.Millisecond }))
	addRenewAll("ttl below MinTTL", "grants[1].ttl", withG(func(g *leasecore.Grant) { g.TTL = time.Millisecond }))
	addRenewAll("token zero", "grants[1].token", withG(func(g *leasecore.Grant) { g.Token = 0 }))
	for _, b := range badNames {
		v := b.v
		addRenewAll("name "+b.label, "grants[1].name", withG(func(g *leasecore.Grant) { g.Name = v }))
	}

	// Valid input, cancelled context: every entry point.
	cancelled := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"acquire", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, "lease-new", "holder-a", time.Minute)
			return err
		}},
		{"renew", func(ctx context.Context) error { _, err := s.leases.Renew(ctx, grant); return err }},
		{"release", func(ctx context.Context) error { return s.leases.Release(ctx, grant) }},
		{"inspect", func(ctx context.Context) error { _, err := s.leases.Inspect(ctx, grant.Name); return err }},
		{"renew all", func(ctx context.Context) error {
			_, _, err := s.leases.RenewAll(ctx, []leasecore.Grant{grant})
			return err
		}},
		{"write batch", func(ctx context.Context) error { _, err := bw.WriteBatch(ctx, okBatch); return err }},
	}
	for _, nr := range s.resources {
		cancelled = append(cancelled, []struct {
			name string
			call func(ctx context.Context) error
		}{
			{nr.name + " write", func(ctx context.Context) error { _, err := nr.r.Write(ctx, okWrite); return err }},
			{nr.name + " floor", func(ctx context.Context) error { _, err := nr.r.Floor(ctx, okWrite.Scope); return err }},
			{nr.name + " read part", func(ctx context.Context) error {
				_, _, err := nr.r.ReadPart(ctx, okWrite.Scope, okWrite.Part)
				return err
			}},
			{nr.name + " attempts", func(ctx context.Context) error { _, err := nr.r.Attempts(ctx, okWrite.Scope); return err }},
		}...)
	}
	for _, c := range cancelled {
		add(c.name+" cancelled context", context.Canceled, "context canceled", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return c.call(ctx)
		})
	}
	return cases
}

// run runs c and checks its error.
func (c badCase) run(t *testing.T) {
	t.Helper()
	err := c.call(context.Background())
	if !errors.Is(err, c.want) {
		t.Fatalf("got error %v, want one wrapping %v", err, c.want)
	}
	if !strings.Contains(err.Error(), c.mention) {
		t.Fatalf("error %q does not mention %q", err, c.mention)
	}
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
				{"/" + strings.Repeat("p", leasecore.MaxNameLen), "longer than"},
			} {
				wantArg(t, c.name+" prefix "+p.prefix, c.call(cli, fenceetcd.WithPrefix(p.prefix)), "prefix", p.mention)
			}
			if err := c.call(cli); err != nil {
				t.Errorf("%s with the default prefix: %v", c.name, err)
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
		write(t, nr.r, "daily-report", "summary", "by "+nr.name, "holder-a", 1)
	}
	before := f.snapshot(t)
	for _, kind := range []string{"/lease/", "/floor/", "/part/", "/attempt/", "/parttoken/", "/published/"} {
		if !strings.Contains(before, kind) {
			t.Fatalf("no %s key to watch:\n%s", kind, before)
		}
	}

	check := func(t *testing.T, c badCase) {
		c.run(t)
		if after := f.snapshot(t); after != before {
			old := before
			before = after // report each change once, not in every later case
			t.Fatalf("keys changed:\nbefore:\n%s\nafter:\n%s", old, after)
		}
	}
	for _, c := range validationCases(s, held) {
		t.Run(c.name, func(t *testing.T) { check(t, c) })
	}

	lost := leasecore.ErrLost
	stranger := held
	stranger.Holder = "holder-x"
	const gone = "no such lease (expired or released)"
	for _, c := range []badCase{
		{"acquire while held", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, held.Name, "holder-b", time.Minute)
			return err
		}, leasecore.ErrHeld, "held"},
		{"renew by non-holder", func(ctx context.Context) error { _, err := s.leases.Renew(ctx, stranger); return err },
			lost, `holder "holder-x" does not hold it`},
		{"release by non-holder", func(ctx context.Context) error { return s.leases.Release(ctx, stranger) },
			lost, `holder "holder-x" does not hold it`},
		{"renew after expiry", func(ctx context.Context) error { _, err := s.leases.Renew(ctx, expired); return err },
			lost, gone},
		{"release after expiry", func(ctx context.Context) error { return s.leases.Release(ctx, expired) },
			lost, gone},
		{"release twice", func(ctx context.Context) error { return s.leases.Release(ctx, released) },
			lost, gone},
		{"renew after release", func(ctx context.Context) error { _, err := s.leases.Renew(ctx, released); return err },
			lost, gone},
	} {
		t.Run(c.name, func(t *testing.T) { check(t, c) })
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
		for _, c := range validationCases(newStores(t, cli, "/nothing"), grant) {
			// A call that did send would wait for the connection until
			// this deadline and fail with it instead.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := c.call(ctx); !errors.Is(err, c.want) {
				t.Errorf("%s: got %v, want an error wrapping %v", c.name, err, c.want)
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
			res := write(t, nr.r, v, v, v, v, leasecore.Token(i+1))
			if !res.Accepted {
				t.Fatalf("%s: write %q: %+v", nr.name, v, res)
			}
			wantPart(t, nr.r, v, v, v, v, leasecore.Token(i+1))
			as, err := nr.r.Attempts(ctx, v)
			if err != nil || len(as) == 0 || as[len(as)-1].Writer != v || as[len(as)-1].Part != v {
				t.Fatalf("%s: attempts of %q: %+v, %v", nr.name, v, as, err)
			}
		}
		wantFloor(t, s.resources[0].r, v, leasecore.Token(i+1))
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
