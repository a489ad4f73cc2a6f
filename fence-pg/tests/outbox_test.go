package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// outboxFixture is a fence fixture with an Outbox on the same database.
type outboxFixture struct {
	fenceFixture
	outbox pgopen.Outbox
}

func newOutboxFixture(t *testing.T, driver string, opts ...fencepg.Option) outboxFixture {
	t.Helper()
	f := newFenceFixture(t, driver, opts...)
	return outboxFixture{f, openOutbox(t, f.resPool, opts...)}
}

func openOutbox(t *testing.T, p pgopen.Pool, opts ...fencepg.Option) pgopen.Outbox {
	t.Helper()
	o, err := p.Outbox(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// publish runs the user's fenced transaction: the job's header row and one
// outbox entry per payload, the way the driver offers (Fence.RunTx / FenceDB.RunTx).
// fail, when set, makes the transaction's function fail after the entries
// were added.
func (f outboxFixture) publish(t *testing.T, c leasecore.Claim, fail error, payloads ...string) (leasecore.Result, []leasecore.OutboxEntry, error) {
	t.Helper()
	ctx := context.Background()
	var added []leasecore.OutboxEntry
	body := func(exec func(q string, args ...any) error, add func(p string) (leasecore.OutboxEntry, error)) error {
		if err := exec(upsertRun, c.Scope, c.Writer, int64(c.Token), len(payloads)); err != nil {
			return err
		}
		for _, p := range payloads {
			e, err := add(p)
			if err != nil {
				return err
			}
			added = append(added, e)
		}
		return fail
	}
	if f.resPool.Pgx != nil {
		res, err := f.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
			return body(func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err },
				func(p string) (leasecore.OutboxEntry, error) {
					return f.outbox.Pgx.Add(ctx, tx, c, "report-published", []byte(p))
				})
		})
		return res, added, err
	}
	res, err := f.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
		return body(func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err },
			func(p string) (leasecore.OutboxEntry, error) {
				return f.outbox.SQL.Add(ctx, tx, c, "report-published", []byte(p))
			})
	})
	return res, added, err
}

// pending returns the pending entries as "writer/token/payload" strings.
func (f outboxFixture) pending(t *testing.T) []string {
	t.Helper()
	es, err := f.outbox.Pending(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s/%s/%d/%s", e.Scope, e.Writer, e.Token, e.Payload))
	}
	return out
}

func wantStrings(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// TestOutboxInFencedTx: entries are added in the fenced transaction and
// commit with it; a stale holder's transaction is rejected whole, so its
// entries never exist; a transaction that fails after adding takes its
// entries with it.
func TestOutboxInFencedTx(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newOutboxFixture(t, driver)
		ctx := context.Background()
		a := leasecore.Claim{Scope: "report", Writer: "holder-a", Token: 1}
		b := leasecore.Claim{Scope: "report", Writer: "holder-b", Token: 2}
		if r, err := f.fence.Advance(ctx, b); err != nil || !r.Accepted {
			t.Fatalf("B's advance: %+v %v", r, err)
		}
		res, added, err := f.publish(t, a, nil, "report(A-stale)")
		if err != nil || res.Accepted || res.Floor != 2 || len(added) != 0 {
			t.Fatalf("A's stale publication: %+v, added %v, %v; want rejected by floor 2, nothing added", res, added, err)
		}
		wantStrings(t, "pending after A's rejected transaction", f.pending(t))

		res, added, err = f.publish(t, b, nil, "report(B) 1", "report(B) 2")
		if err != nil || !res.Accepted {
			t.Fatalf("B's publication: %+v %v", res, err)
		}
		wantStrings(t, "pending after B's transaction", f.pending(t), "report/holder-b/2/report(B) 1", "report/holder-b/2/report(B) 2")
		es, err := f.outbox.Pending(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range es {
			if !uuidRE.MatchString(e.ID) || e.ID != added[i].ID || e.Seq != added[i].Seq || e.Topic != "report-published" ||
				e.At.IsZero() || !e.At.Equal(added[i].At) {
				t.Fatalf("entry %d: read %+v, Add returned %+v", i, e, added[i])
			}
		}
		if es[0].ID == es[1].ID || es[0].Seq >= es[1].Seq {
			t.Fatalf("two entries of one transaction: ids %s %s, seqs %d %d", es[0].ID, es[1].ID, es[0].Seq, es[1].Seq)
		}

		boom := errors.New("the job failed after publishing")
		if _, _, err := f.publish(t, b, boom, "report(B) rolled back"); !errors.Is(err, boom) {
			t.Fatalf("failing transaction: %v", err)
		}
		wantStrings(t, "pending after a failed transaction", f.pending(t), "report/holder-b/2/report(B) 1", "report/holder-b/2/report(B) 2")
		if got := f.job(t, "report"); got != "holder-b/2/2 lines=-" {
			t.Fatalf("job rows: %q", got)
		}
	})
}

// TestOutboxAddNeedsTheFloor: Add inserts only while the scope's floor is
// the claim's token (a floor not raised yet, or raised past the token,
// inserts nothing and says why, naming the floor), and in a transaction the
// caller ends with Commit the comparison at commit covers the
// entry: a newer token advanced between Add and the commit rejects the
// transaction, entry included.
func TestOutboxAddNeedsTheFloor(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newOutboxFixture(t, driver)
		ctx := context.Background()
		c := leasecore.Claim{Scope: "s", Writer: "w", Token: 5}
		// inTx runs a transaction of the caller's: Add, then (when Add
		// succeeded) between, then Commit.
		inTx := func(add leasecore.Claim, between func()) (leasecore.Result, error) {
			if p := f.resPool.Pgx; p != nil {
				tx, err := p.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
				if _, err := f.outbox.Pgx.Add(ctx, tx, add, "t", []byte("p")); err != nil {
					return leasecore.Result{}, err
				}
				between()
				return f.fence.Pgx.Commit(ctx, tx, add)
			}
			tx, err := f.resPool.SQL.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
			if _, err := f.outbox.SQL.Add(ctx, tx, add, "t", []byte("p")); err != nil {
				return leasecore.Result{}, err
			}
			between()
			return f.fence.SQL.Commit(ctx, tx, add)
		}
		nothing := func() {}
		_, err := inTx(c, nothing)
		var ae *leasecore.ArgError
		if !errors.As(err, &ae) || ae.Field != "tx" || !strings.Contains(err.Error(), `the floor of scope "s" is 0, not the claim's token 5`) {
			t.Fatalf("Add before the floor was raised: %v", err)
		}
		if r, err := f.fence.Advance(ctx, c); err != nil || !r.Accepted {
			t.Fatalf("advance: %+v %v", r, err)
		}
		other := c
		other.Token = 4
		if _, err := inTx(other, nothing); !errors.Is(err, leasecore.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), `the floor of scope "s" is 5, not the claim's token 4`) {
			t.Fatalf("Add of a stale claim: %v", err)
		}
		wantStrings(t, "pending after refused adds", f.pending(t))
		if res, err := inTx(c, nothing); err != nil || !res.Accepted {
			t.Fatalf("Add at the floor's token, then Commit: %+v %v", res, err)
		}
		wantStrings(t, "pending", f.pending(t), "s/w/5/p")
		// A newer holder advances while the transaction is open after Add
		// (the holder could be frozen there): the commit rejects it.
		newer := leasecore.Claim{Scope: "s", Writer: "w2", Token: 6}
		res, err := inTx(c, func() {
			if r, err := f.fence.Advance(ctx, newer); err != nil || !r.Accepted {
				t.Fatalf("newer advance while the transaction is open: %+v %v (it must not wait)", r, err)
			}
		})
		backendtest.WantResult(t, "commit after a newer advance", res, false, 6)
		if err != nil {
			t.Fatal(err)
		}
		wantStrings(t, "pending after the rejected commit", f.pending(t), "s/w/5/p")
	})
}

// TestOutboxRelay: entries are delivered in seq order, across scopes, and
// marked only after deliver returned nil (the entry is still pending while
// deliver runs); an error stops the relay and keeps that entry and the
// later ones pending, in order; a cancelled context stops it, and an entry
// already acknowledged is marked all the same.
func TestOutboxRelay(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newOutboxFixture(t, driver)
		ctx := context.Background()
		for i, scope := range []string{"s1", "s2", "s1", "s2", "s1"} {
			c := leasecore.Claim{Scope: scope, Writer: "w", Token: 7}
			if _, _, err := f.publish(t, c, nil, fmt.Sprintf("p%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		fail := errors.New("downstream unavailable")
		n, err := f.outbox.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
			if string(e.Payload) == "p3" {
				return fail
			}
			// Not marked yet: the relay marks after deliver returns.
			still := false
			for _, p := range f.pending(t) {
				still = still || strings.HasSuffix(p, "/"+string(e.Payload))
			}
			if !still {
				t.Errorf("entry %s is no longer pending while deliver runs", e.Payload)
			}
			got = append(got, string(e.Payload))
			return nil
		})
		if n != 3 || !errors.Is(err, fail) {
			t.Fatalf("relay: n=%d err=%v; want 3 and the deliver error", n, err)
		}
		wantStrings(t, "delivered", got, "p0", "p1", "p2")
		wantStrings(t, "pending after the failed delivery", f.pending(t), "s2/w/7/p3", "s1/w/7/p4")

		// The caller gives up right after the downstream acknowledged: the
		// mark is under ctx too, so the entry stays pending and the next
		// relay delivers it again, with the same ID.
		cctx, cancel := context.WithCancel(ctx)
		var cancelledID string
		n, err = f.outbox.Relay(cctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
			cancelledID = e.ID
			cancel()
			return nil
		})
		if n != 0 || !errors.Is(err, context.Canceled) {
			t.Fatalf("relay with a cancelled context: n=%d err=%v", n, err)
		}
		wantStrings(t, "pending after the cancelled relay", f.pending(t), "s2/w/7/p3", "s1/w/7/p4")
		var again []string
		if n, err := f.outbox.Relay(ctx, func(_ context.Context, e leasecore.OutboxEntry) error {
			again = append(again, e.ID)
			return nil
		}); n != 2 || err != nil {
			t.Fatalf("last relay: %d %v", n, err)
		}
		if len(again) != 2 || again[0] != cancelledID {
			t.Fatalf("last relay delivered %v, want %s (the entry the cancelled relay could not mark) first", again, cancelledID)
		}
		wantStrings(t, "pending at the end", f.pending(t))
		if n, err := f.outbox.Relay(ctx, func(context.Context, leasecore.OutboxEntry) error { return nil }); n != 0 || err != nil {
			t.Fatalf("relay with nothing pending: %d %v", n, err)
		}
	})
}

// downstream is the side a relay delivers to, following the rules of
// leasecore.OutboxEntry: an ID seen before is a no-op, a token below the
// scope's highest is rejected as stale; both are acknowledged.
type downstream struct {
	mu       sync.Mutex
	seen     map[string]int // accepted deliveries per ID
	highest  map[string]leasecore.Token
	received int
	stale    []string
}

func newDownstream() *downstream {
	return &downstream{seen: map[string]int{}, highest: map[string]leasecore.Token{}}
}

func (d *downstream) deliver(_ context.Context, e leasecore.OutboxEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.received++
	switch {
	case d.seen[e.ID] > 0:
	case e.Token < d.highest[e.Scope]:
		d.stale = append(d.stale, string(e.Payload))
	default:
		d.seen[e.ID]++
		d.highest[e.Scope] = e.Token
	}
	return nil
}

// TestOutboxConcurrentRelays: three relays at once over entries of two
// scopes and rising tokens, while writers keep adding: every entry is
// accepted exactly once by a downstream that deduplicates by ID, none is
// rejected as stale (no relay delivers a newer token of a scope before an
// older one), and nothing stays pending.
func TestOutboxConcurrentRelays(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newOutboxFixture(t, driver)
		ctx := context.Background()
		const perToken = 10
		var ids []string
		var idsMu sync.Mutex
		var writers sync.WaitGroup
		for _, scope := range []string{"s1", "s2"} {
			writers.Go(func() {
				for token := leasecore.Token(1); token <= 3; token++ {
					c := leasecore.Claim{Scope: scope, Writer: fmt.Sprint("w", token), Token: token}
					for i := range perToken {
						_, added, err := f.publish(t, c, nil, fmt.Sprintf("%s-%d-%d", scope, token, i))
						if err != nil {
							t.Error(err)
							return
						}
						idsMu.Lock()
						ids = append(ids, added[0].ID)
						idsMu.Unlock()
					}
				}
			})
		}
		d := newDownstream()
		var relays sync.WaitGroup
		done := make(chan struct{})
		for range 3 {
			relays.Go(func() {
				for {
					if _, err := f.outbox.Relay(ctx, d.deliver); err != nil {
						t.Error(err)
						return
					}
					select {
					case <-done:
						_, err := f.outbox.Relay(ctx, d.deliver) // the last entries
						if err != nil {
							t.Error(err)
						}
						return
					case <-time.After(time.Millisecond):
					}
				}
			})
		}
		writers.Wait()
		close(done)
		relays.Wait()
		if len(d.stale) > 0 {
			t.Errorf("entries rejected as stale: %v", d.stale)
		}
		if len(ids) != 2*3*perToken || len(d.seen) != len(ids) {
			t.Fatalf("written %d, accepted %d distinct", len(ids), len(d.seen))
		}
		for _, id := range ids {
			if d.seen[id] != 1 {
				t.Errorf("entry %s accepted %d times", id, d.seen[id])
			}
		}
		wantStrings(t, "pending at the end", f.pending(t))
		t.Logf("%d entries, %d deliveries on the wire (duplicates are concurrent relays' overlap)", len(ids), d.received)
	})
}

// TestOutboxPruneDelivered: only delivered entries older than the bound go.
func TestOutboxPruneDelivered(t *testing.T) {
	f := newOutboxFixture(t, pgopen.Pgx)
	ctx := context.Background()
	c := leasecore.Claim{Scope: "s", Writer: "w", Token: 1}
	for _, p := range []string{"a", "b"} {
		if _, _, err := f.publish(t, c, nil, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.outbox.Relay(ctx, func(_ context.Context, e leasecore.OutboxEntry) error {
		if string(e.Payload) == "b" {
			return errors.New("not now")
		}
		return nil
	}); err == nil {
		t.Fatal("relay: no error")
	}
	n, err := f.outbox.PruneDelivered(ctx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
	wantStrings(t, "pending after the prune", f.pending(t), "s/w/1/b")
	var rows int
	if err := f.resourceDB.QueryRow(ctx, `SELECT count(*) FROM leasefence.outbox`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("rows left: %d %v", rows, err)
	}
}

// TestOutboxBadInput: every entry point names the bad field, wraps
// leasecore.ErrInvalidArgument and writes nothing.
func TestOutboxBadInput(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newOutboxFixture(t, driver)
		ctx := context.Background()
		c := leasecore.Claim{Scope: "s", Writer: "w", Token: 1}
		if _, _, err := f.publish(t, c, nil, "first"); err != nil {
			t.Fatal(err)
		}
		before := f.pending(t)
		wantField := func(what, field string, err error) {
			t.Helper()
			var ae *leasecore.ArgError
			if !errors.As(err, &ae) || ae.Field != field || !errors.Is(err, leasecore.ErrInvalidArgument) {
				t.Errorf("%s: %v, want an ArgError for field %q", what, err, field)
			}
		}
		// Add's input, inside an accepted fenced transaction.
		for _, tc := range []struct {
			what, field, topic string
			c                  leasecore.Claim
			payload            []byte
		}{
			{"empty topic", "topic", "", c, nil},
			{"topic with NUL", "topic", "a\x00", c, nil},
			{"payload too large", "payload", "t", c, make([]byte, backendkit.MaxPayloadLen+1)},
			{"no writer", "writer", "t", leasecore.Claim{Scope: "s", Token: 1}, nil},
			{"token 0", "token", "t", leasecore.Claim{Scope: "s", Writer: "w"}, nil},
		} {
			var err error
			if f.fence.Pgx != nil {
				_, _ = f.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
					_, err = f.outbox.Pgx.Add(ctx, tx, tc.c, tc.topic, tc.payload)
					return err
				})
			} else {
				_, _ = f.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
					_, err = f.outbox.SQL.Add(ctx, tx, tc.c, tc.topic, tc.payload)
					return err
				})
			}
			wantField(tc.what, tc.field, err)
		}
		var err error
		if f.outbox.Pgx != nil {
			_, err = f.outbox.Pgx.Add(ctx, nil, c, "t", nil)
		} else {
			_, err = f.outbox.SQL.Add(ctx, nil, c, "t", nil)
		}
		wantField("nil tx", "tx", err)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if p := f.resPool.Pgx; p != nil {
			tx, err := p.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.outbox.Pgx.Add(cancelled, tx, c, "t", nil); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled Add: %v", err)
			}
			_ = tx.Rollback(ctx)
		}
		_, err = f.outbox.Relay(ctx, nil)
		wantField("nil deliver", "deliver", err)
		if _, err := f.outbox.Relay(cancelled, func(context.Context, leasecore.OutboxEntry) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled relay: %v", err)
		}
		for _, limit := range []int{0, -1, backendkit.MaxAttemptsRead + 1} {
			_, err := f.outbox.Pending(ctx, limit)
			wantField(fmt.Sprint("pending limit ", limit), "limit", err)
		}
		_, err = f.outbox.PruneDelivered(ctx, time.Time{})
		wantField("prune zero time", "before", err)
		_, err = f.outbox.PruneDelivered(ctx, time.Now().Add(time.Hour))
		wantField("prune future", "before", err)
		_, err = fencepg.NewOutbox(nil)
		wantField("nil pool", "pool", err)
		_, err = fencepg.NewOutboxDB(nil)
		wantField("nil db", "db", err)
		if f.resPool.Pgx != nil {
			_, err = fencepg.NewOutbox(f.resPool.Pgx, fencepg.WithSchema("Bad"))
			wantField("bad schema", "schema", err)
		}
		wantStrings(t, "pending after bad input", f.pending(t), before...)
	})
}

// TestOutboxRuntimeRole: a role with exactly the grants ResourceDDL lists
// for the outbox (and the fence's) passes Preflight and runs Add, Relay,
// Pending and PruneDelivered in a schema of WithSchema; without its grants
// on outbox, Preflight names them.
func TestOutboxRuntimeRole(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		dsn := pgtest.CreateDB(t, "outbox_role_"+driver)
		owner := pgtest.Open(t, driver, dsn, 1)
		ddl, err := fencepg.ResourceDDL("app_fence")
		if err != nil {
			t.Fatal(err)
		}
		role := "lf_outbox_" + driver
		grants := fmt.Sprintf(`
			DO $$ BEGIN CREATE ROLE %[1]s LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
			GRANT USAGE ON SCHEMA app_fence TO %[1]s;
			GRANT SELECT, INSERT, UPDATE ON app_fence.fence_floor TO %[1]s;
			GRANT SELECT, INSERT ON app_fence.write_attempt TO %[1]s;`, role)
		for _, s := range []string{ddl, grants} {
			if _, err := pgtest.DB(owner).Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role)
		p := pgtest.Open(t, driver, u.String(), 2)
		opt := fencepg.WithSchema("app_fence")
		f := outboxFixture{fenceFixture{&fixture{resPool: p, resourceDB: pgtest.DB(p)}, openFence(t, p, opt)}, openOutbox(t, p, opt)}
		err = f.outbox.Preflight(ctx)
		if !errors.Is(err, leasecore.ErrConfig) || !strings.Contains(err.Error(), "GRANT INSERT, UPDATE ON app_fence.outbox TO "+role) &&
			!strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE ON app_fence.outbox TO "+role) {
			t.Fatalf("preflight without outbox grants: %v", err)
		}
		if _, err := pgtest.DB(owner).Exec(ctx, fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON app_fence.outbox TO %s`, role)); err != nil {
			t.Fatal(err)
		}
		if err := f.outbox.Preflight(ctx); err != nil {
			t.Fatalf("preflight with the documented grants: %v", err)
		}
		c := leasecore.Claim{Scope: "s", Writer: "w", Token: 3}
		var res leasecore.Result
		if p.Pgx != nil {
			res, err = f.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
				_, err := f.outbox.Pgx.Add(ctx, tx, c, "t", []byte("p"))
				return err
			})
		} else {
			res, err = f.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
				_, err := f.outbox.SQL.Add(ctx, tx, c, "t", []byte("p"))
				return err
			})
		}
		if err != nil || !res.Accepted {
			t.Fatalf("add as the runtime role: %+v %v", res, err)
		}
		if n, err := f.outbox.Relay(ctx, func(context.Context, leasecore.OutboxEntry) error { return nil }); n != 1 || err != nil {
			t.Fatalf("relay as the runtime role: %d %v", n, err)
		}
		if _, err := f.outbox.PruneDelivered(ctx, time.Now()); err != nil {
			t.Fatalf("prune as the runtime role: %v", err)
		}
	})
}

// TestOutboxRelayLateCommittedEntry: an entry whose transaction commits
// after the relay has read past its seq is still delivered before the
// newer entries of its scope. Sequence numbers follow insert order, commits
// do not: here s1's token-1 entry takes its seq, then s2's entry (a larger
// seq) commits first, and the relay reads and delivers it alone. While the
// downstream handles it, s1's transaction commits and s1's token-2 entry is
// added. A relay that went on from the seq it last delivered would skip
// s1's token-1 entry and deliver token 2 first, and the downstream would
// then reject token 1 as stale, a version of the scope it never saw.
func TestOutboxRelayLateCommittedEntry(t *testing.T) {
	f := newOutboxFixture(t, pgopen.Pgx)
	ctx := context.Background()
	s1 := leasecore.Claim{Scope: "s1", Writer: "w1", Token: 1}
	added, commit := make(chan error, 1), make(chan struct{})
	var open sync.WaitGroup
	open.Go(func() {
		_, err := f.fence.Pgx.RunTx(ctx, s1, func(tx pgx.Tx) error {
			_, err := f.outbox.Pgx.Add(ctx, tx, s1, "report-published", []byte("s1-1"))
			added <- err
			<-commit
			return err
		})
		if err != nil {
			t.Error(err)
		}
	})
	if err := <-added; err != nil {
		close(commit)
		t.Fatal(err)
	}
	if _, _, err := f.publish(t, leasecore.Claim{Scope: "s2", Writer: "w1", Token: 1}, nil, "s2-1"); err != nil {
		close(commit)
		t.Fatal(err)
	}

	d := newDownstream()
	var order []string
	n, err := f.outbox.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
		order = append(order, string(e.Payload))
		if string(e.Payload) == "s2-1" {
			close(commit) // s1's token-1 entry commits behind the relay's cursor
			open.Wait()
			if _, _, err := f.publish(t, leasecore.Claim{Scope: "s1", Writer: "w2", Token: 2}, nil, "s1-2"); err != nil {
				return err
			}
		}
		return d.deliver(ctx, e)
	})
	if err != nil {
		t.Fatal(err)
	}
	wantStrings(t, "delivery order", order, "s2-1", "s1-1", "s1-2")
	if n != 3 || len(d.stale) > 0 {
		t.Fatalf("delivered %d, rejected as stale %v: want 3, none", n, d.stale)
	}
	wantStrings(t, "pending at the end", f.pending(t))
}
