package pgcontrol_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newControls returns migrated controls on a fresh resource database.
func newControls(t *testing.T, driver string) *pgcontrol.Controls {
	t.Helper()
	c, err := pgtest.Open(t, driver, pgtest.CreateDB(t, "res_"+driver), 3).Controls()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil { // idempotent
		t.Fatal(err)
	}
	return c
}

type step struct {
	part, content, writer string
	token                 leasecore.Token
	accepted              bool
	floor                 leasecore.Token
}

// play writes each step to r and checks its result.
func play(t *testing.T, r *pgcontrol.Resource, scope string, steps ...step) {
	t.Helper()
	for _, s := range steps {
		res, err := r.Write(context.Background(), leasecore.Write{
			Scope: scope, Part: s.part, Content: s.content, Writer: s.writer, Token: s.token})
		if err != nil {
			t.Fatal(err)
		}
		if res.Accepted != s.accepted || res.Floor != s.floor {
			t.Fatalf("%s token %d on %s: got %+v, want accepted=%v floor=%d", s.writer, s.token, s.part, res, s.accepted, s.floor)
		}
	}
}

// state renders a part, the floor and the write log.
func state(t *testing.T, r *pgcontrol.Resource, scope, part string) string {
	t.Helper()
	ctx := context.Background()
	p, ok, err := r.ReadPart(ctx, scope, part)
	if err != nil {
		t.Fatal(err)
	}
	floor, err := r.Floor(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	as, err := r.Attempts(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	s := fmt.Sprintf("floor=%d", floor)
	if ok {
		s += fmt.Sprintf(" %s=%q by %s token %d", part, p.Content, p.Writer, p.Token)
	}
	for _, a := range as {
		s += fmt.Sprintf(" [%s %s %d %v %d]", a.Part, a.Writer, a.Token, a.Accepted, a.Floor)
	}
	return s
}

func want(t *testing.T, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

// Each control shows its flaw on the real server.
func TestControls(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		c := newControls(t, driver)

		t.Run("unfenced: the stale write overwrites", func(t *testing.T) {
			r := c.Unfenced()
			play(t, r, "u",
				step{"summary", "new", "holder-b", 2, true, 0},
				step{"summary", "stale", "holder-a", 1, true, 0})
			want(t, state(t, r, "u", "summary"),
				`floor=0 summary="stale" by holder-a token 1 [summary holder-b 2 true 0] [summary holder-a 1 true 0]`)
		})

		t.Run("check-then-write: the floor moves back", func(t *testing.T) {
			// A reads floor 0 and pauses; B runs a whole write; A resumes.
			r := c.CheckThenWrite(func(ctx context.Context, w leasecore.Write) error {
				if w.Writer == "holder-a" {
					play(t, c.CheckThenWrite(nil), "ctw", step{"summary", "new", "holder-b", 2, true, 2})
				}
				return nil
			})
			play(t, r, "ctw", step{"summary", "old", "holder-a", 1, true, 1})
			want(t, state(t, r, "ctw", "summary"),
				`floor=1 summary="old" by holder-a token 1 [summary holder-b 2 true 2] [summary holder-a 1 true 1]`)
			// Without the interleaving it does reject, and logs it.
			play(t, r, "ctw", step{"summary", "new", "holder-b", 2, true, 2}, step{"detail", "x", "holder-a", 1, false, 2})
		})

		t.Run("row-fenced: a new part has nothing to compare", func(t *testing.T) {
			r := c.RowFenced()
			play(t, r, "row",
				step{"summary", "a", "holder-a", 1, true, 0},
				step{"summary", "b", "holder-b", 2, true, 0},
				step{"summary", "stale", "holder-a", 1, false, 0},
				step{"detail", "stale", "holder-a", 1, true, 0})
			want(t, state(t, r, "row", "detail"),
				`floor=0 detail="stale" by holder-a token 1 [summary holder-a 1 true 0] [summary holder-b 2 true 0]`+
					` [summary holder-a 1 false 0] [detail holder-a 1 true 0]`)
		})

		t.Run("publisher: the first write of a key stays", func(t *testing.T) {
			r := c.IdempotentPublisher()
			play(t, r, "pub",
				step{"summary", "stale", "holder-a", 1, true, 0},
				step{"summary", "new", "holder-b", 2, false, 0})
			want(t, state(t, r, "pub", "summary"),
				`floor=0 summary="stale" by holder-a token 1 [summary holder-a 1 true 0] [summary holder-b 2 false 0]`)
			// Keys are (scope, part): a "/" in a name does not merge two keys.
			play(t, r, "a/b", step{"c", "1", "w", 1, true, 0})
			play(t, r, "a", step{"b/c", "2", "w", 1, true, 0})
		})
	})
}
