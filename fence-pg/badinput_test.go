package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgopen"
	"github.com/leasefence/leasefence/fence-pg/internal/pgtest"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
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

// stores are every public entry point on one pair of pools.
type stores struct {
	leases    *fencepg.LeaseStore
	res       *fencepg.Resource
	controls  *pgcontrol.Controls
	resources []namedResource // res and each control
}

func newStores(t *testing.T, lease, res pgopen.Pool) stores {
	t.Helper()
	var s stores
	var err error
	if s.leases, err = lease.LeaseStore(); err != nil {
		t.Fatal(err)
	}
	if s.res, err = res.Resource(); err != nil {
		t.Fatal(err)
	}
	if s.controls, err = res.Controls(); err != nil {
		t.Fatal(err)
	}
	s.resources = []namedResource{
		{"fenced", s.res},
		{"unfenced", s.controls.Unfenced()},
		{"check-then-write", s.controls.CheckThenWrite(nil)},
		{"row-fenced", s.controls.RowFenced()},
		{"publisher", s.controls.IdempotentPublisher()},
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
// sent: bad identifiers, TTLs, tokens and contents on every entry point,
// and an already-cancelled context. grant is a grant the store issued.
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
		label string
		d     time.Duration
	}{
		{"zero", 0}, {"negative", -time.Second}, {"below MinTTL", fencepg.MinTTL - time.Microsecond},
		{"above MaxTTL", leasecore.MaxTTL + time.Nanosecond}, {"MaxInt64", time.Duration(math.MaxInt64)},
	} {
		g := with(func(g *leasecore.Grant) { g.TTL = ttl.d })
		add("acquire ttl "+ttl.label, inv, "ttl", func(ctx context.Context) error {
			_, err := s.leases.Acquire(ctx, "lease-new", "holder-a", ttl.d)
			return err
		})
		add("renew ttl "+ttl.label, inv, "ttl", func(ctx context.Context) error {
			_, err := s.leases.Renew(ctx, g)
			return err
		})
		add("release ttl "+ttl.label, inv, "ttl", func(ctx context.Context) error { return s.leases.Release(ctx, g) })
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

	// Valid input, cancelled context: every entry point, Migrate included.
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
		{"lease migrate", s.leases.Migrate},
		{"resource migrate", s.res.Migrate},
		{"controls migrate", s.controls.Migrate},
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
// context with the right sentinel and a message naming the field, and the
// tables are exactly as before; renew and release of a holding period that
// is not current fail with ErrLost and change nothing either.
func TestBadInput(t *testing.T) {
	t.Run("constructors", func(t *testing.T) {
		for _, c := range []struct {
			name, field string
			call        func() error
		}{
			{"NewLeaseStore", "pool", func() error { _, err := fencepg.NewLeaseStore(nil); return err }},
			{"NewLeaseStoreDB", "db", func() error { _, err := fencepg.NewLeaseStoreDB(nil); return err }},
			{"NewResource", "pool", func() error { _, err := fencepg.NewResource(nil); return err }},
			{"NewResourceDB", "db", func() error { _, err := fencepg.NewResourceDB(nil); return err }},
			{"pgcontrol.New", "pool", func() error { _, err := pgcontrol.New(nil); return err }},
			{"pgcontrol.NewDB", "db", func() error { _, err := pgcontrol.NewDB(nil); return err }},
		} {
			var ae *leasecore.ArgError
			err := c.call()
			if !errors.As(err, &ae) || !errors.Is(err, leasecore.ErrInvalidArgument) || ae.Field != c.field ||
				!strings.Contains(err.Error(), c.field) {
				t.Errorf("%s(nil): got %v, want a *leasecore.ArgError for field %q", c.name, err, c.field)
			}
		}
	})

	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		s := newStores(t, f.leasePool, f.resPool)
		ctx := context.Background()

		// Something in every table, so "nothing changed" means something.
		held, err := s.leases.Acquire(ctx, "held-lease", "holder-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		expired, err := s.leases.Acquire(ctx, "expired-lease", "holder-a", fencepg.MinTTL)
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
		waitExpired(t, f, expired.Name)
		for _, nr := range s.resources {
			write(t, nr.r, "daily-report", "summary", "by "+nr.name, "holder-a", 1)
		}
		before := f.snapshot(t)

		check := func(t *testing.T, c badCase) {
			c.run(t)
			if after := f.snapshot(t); after != before {
				old := before
				before = after // report each change once, not in every later case
				t.Fatalf("tables changed:\nbefore:\n%s\nafter:\n%s", old, after)
			}
		}
		for _, c := range validationCases(s, held) {
			t.Run(c.name, func(t *testing.T) { check(t, c) })
		}

		lost := leasecore.ErrLost
		stranger := held
		stranger.Holder = "holder-x"
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
				lost, "expired"},
			{"release after expiry", func(ctx context.Context) error { return s.leases.Release(ctx, expired) },
				lost, "expired"},
			{"release twice", func(ctx context.Context) error { return s.leases.Release(ctx, released) },
				lost, "released"},
			{"renew after release", func(ctx context.Context) error { _, err := s.leases.Renew(ctx, released); return err },
				lost, "released"},
		} {
			t.Run(c.name, func(t *testing.T) { check(t, c) })
		}
	})

	// The same calls against a server nobody listens on fail the same
	// way: the input is rejected before anything is sent.
	t.Run("nothing sent", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dsn := "postgres://postgres@" + ln.Addr().String() + "/nothing?sslmode=disable"
		ln.Close()
		pool, err := pgxpool.New(context.Background(), dsn) // connects lazily
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		grant := leasecore.Grant{Name: "held-lease", Holder: "holder-a", Token: 1, TTL: time.Hour}
		for _, p := range []pgopen.Pool{{Pgx: pool}, {SQL: db}} {
			for _, c := range validationCases(newStores(t, p, p), grant) {
				if err := c.call(context.Background()); !errors.Is(err, c.want) {
					t.Errorf("%s: got %v, want an error wrapping %v", c.name, err, c.want)
				}
			}
		}
	})
}

// TestSQLLookingInputIsData: names that look like SQL are valid names.
// They travel as bound parameters, so they are stored and read back
// verbatim and nothing else happens.
func TestSQLLookingInputIsData(t *testing.T) {
	values := []string{
		`x'); DROP TABLE lease; --`,
		`"; DROP TABLE fence_floor; --`,
		`Robert'); DROP TABLE report_part;--`,
		`' OR '1'='1`,
		`$1`, `%`, `_`, `\`, `-infinity`,
		`scope/with/slashes`, `日报 summary`,
	}
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		s := newStores(t, f.leasePool, f.resPool)
		ctx := context.Background()
		for i, v := range values {
			g, err := s.leases.Acquire(ctx, v, v, time.Hour)
			if err != nil || g.Token != 1 || g.Name != v || g.Holder != v {
				t.Fatalf("acquire %q: %+v, %v", v, g, err)
			}
			st, err := s.leases.Inspect(ctx, v)
			if err != nil || !st.Exists || st.Holder != v || st.Token != 1 {
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
			// The fenced write set the floor; the controls left it alone
			// (check-then-write set it to the same token).
			wantFloor(t, s.res, v, leasecore.Token(i+1))
		}
		// Every table is still there and holds exactly what was written.
		for _, c := range []struct {
			table string
			want  int
		}{
			{"lease", len(values)}, {"fence_floor", len(values)}, {"report_part", len(values)},
			{"write_attempt", len(values) * len(s.resources)}, {"published", len(values)},
		} {
			db := f.resourceDB
			if c.table == "lease" {
				db = f.leaseDB
			}
			var n int
			if err := db.QueryRow(ctx, "SELECT count(*) FROM "+c.table).Scan(&n); err != nil || n != c.want {
				t.Errorf("%s: %d rows, %v; want %d", c.table, n, err, c.want)
			}
		}
	})
}
