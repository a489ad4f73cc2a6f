package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
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
	if s.res, err = res.Resource(fencepg.WithAttemptLog(leasecore.LogAll)); err != nil {
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

// badCalls returns the bad-input rows of conformance case X1 for every
// public entry point on s: the lease store and the fenced resource, and
// each negative control (which the suite does not see). X1 judges
// "nothing changed" by what the readers show; TestBadInput runs the same
// rows against every table, and against a server nobody listens on. Only
// fencepg has the last rows: Migrate with a cancelled context. grant is a
// valid grant of s.leases.
func badCalls(s stores, grant leasecore.Grant) []conformance.BadCall {
	okWrite := leasecore.Write{Scope: "daily-report", Part: "summary", Content: "x", Writer: "holder-a", Token: 1}
	calls := conformance.BadInputCalls(conformance.BadInput{
		Lease: s.leases, Grant: grant, Free: "lease-new",
		Resource: s.res, Write: okWrite, SecondPart: "detail",
		MinTTL: fencepg.MinTTL,
	})
	for _, nr := range s.resources[1:] { // the controls
		for _, c := range conformance.BadInputCalls(conformance.BadInput{Resource: nr.r, Write: okWrite}) {
			c.Name = nr.name + " " + c.Name
			calls = append(calls, c)
		}
	}
	for _, m := range []struct {
		name string
		call func(ctx context.Context) error
	}{{"lease migrate", s.leases.Migrate}, {"resource migrate", s.res.Migrate}, {"controls migrate", s.controls.Migrate}} {
		calls = append(calls, conformance.BadCall{Group: "migrate", Name: m.name + " cancelled context",
			Want: context.Canceled, Mention: "context canceled", Call: func(ctx context.Context) error {
				ctx, cancel := context.WithCancel(ctx)
				cancel()
				return m.call(ctx)
			}})
	}
	return calls
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
			backendtest.Write(t, nr.r, "daily-report", "summary", "by "+nr.name, "holder-a", 1)
		}
		before := f.snapshot(t)

		check := func(t *testing.T, c conformance.BadCall) {
			if err := c.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if after := f.snapshot(t); after != before {
				old := before
				before = after // report each change once, not in every later case
				t.Fatalf("tables changed:\nbefore:\n%s\nafter:\n%s", old, after)
			}
		}
		for _, c := range badCalls(s, held) {
			t.Run(c.Name, func(t *testing.T) { check(t, c) })
		}

		lost := leasecore.ErrLost
		stranger := held
		stranger.Holder = "holder-x"
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
			hold("renew after expiry", lost, "expired",
				func(ctx context.Context) error { _, err := s.leases.Renew(ctx, expired); return err }),
			hold("release after expiry", lost, "expired",
				func(ctx context.Context) error { return s.leases.Release(ctx, expired) }),
			hold("release twice", lost, "released",
				func(ctx context.Context) error { return s.leases.Release(ctx, released) }),
			hold("renew after release", lost, "released",
				func(ctx context.Context) error { _, err := s.leases.Renew(ctx, released); return err }),
		} {
			t.Run(c.Name, func(t *testing.T) { check(t, c) })
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
			for _, c := range badCalls(newStores(t, p, p), grant) {
				if err := c.Run(context.Background()); err != nil {
					t.Errorf("%s: %v", c.Name, err)
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
			// The fenced write set the floor; the controls left it alone
			// (check-then-write set it to the same token).
			backendtest.WantFloor(t, s.res, v, leasecore.Token(i+1))
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
			if err := db.QueryRow(ctx, "SELECT count(*) FROM leasefence."+c.table).Scan(&n); err != nil || n != c.want {
				t.Errorf("%s: %d rows, %v; want %d", c.table, n, err, c.want)
			}
		}
	})
}
