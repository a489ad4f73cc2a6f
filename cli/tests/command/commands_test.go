package command_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/cli/internal/command"
	"github.com/leasefence/leasefence/cli/tests/internal/clitest"
	"github.com/leasefence/leasefence/leasecore"
)

// The --json documents, as a machine reads them.
type (
	leaseDoc struct {
		Name        string `json:"name"`
		State       string `json:"state"`
		Exists      bool   `json:"exists"`
		Held        bool   `json:"held"`
		Released    bool   `json:"released"`
		Holder      string `json:"holder"`
		Token       uint64 `json:"token"`
		RemainingMS int64  `json:"remaining_ms"`
	}
	statusDoc struct {
		Backend string     `json:"backend"`
		Leases  []leaseDoc `json:"leases"`
		More    bool       `json:"more"`
	}
	floorDoc struct {
		Scope      string `json:"scope"`
		Floor      uint64 `json:"floor"`
		Lease      string `json:"lease"`
		LeaseBound uint64 `json:"lease_bound"`
		Check      string `json:"check"`
		Message    string `json:"message"`
	}
	floorsDoc struct {
		Backend  string     `json:"backend"`
		Floors   []floorDoc `json:"floors"`
		Warnings int        `json:"warnings"`
		Checked  bool       `json:"checked"`
	}
	attemptDoc struct {
		At       time.Time `json:"at"`
		Scope    string    `json:"scope"`
		Part     string    `json:"part"`
		Writer   string    `json:"writer"`
		Token    uint64    `json:"token"`
		Accepted bool      `json:"accepted"`
		Floor    uint64    `json:"floor"`
	}
	attemptsDoc struct {
		Backend  string       `json:"backend"`
		Scope    string       `json:"scope"`
		Rejected bool         `json:"rejected_only"`
		Attempts []attemptDoc `json:"attempts"`
	}
	advanceDoc struct {
		Scope       string `json:"scope"`
		Token       uint64 `json:"token"`
		Accepted    bool   `json:"accepted"`
		FloorBefore uint64 `json:"floor_before"`
		Floor       uint64 `json:"floor"`
		Note        string `json:"note"`
	}
	breakDoc struct {
		Lease  string   `json:"lease"`
		Ended  leaseDoc `json:"ended"`
		Holder string   `json:"holder"`
		Token  uint64   `json:"token"`
		Took   bool     `json:"took_over"`
		Scopes []struct {
			Scope    string `json:"scope"`
			Advanced bool   `json:"advanced"`
			Floor    uint64 `json:"floor"`
			Warning  string `json:"warning"`
		} `json:"scopes"`
		Released bool `json:"released"`
	}
)

// floorOf reads a scope's floor through the command.
func (w *world) floorOf(t *testing.T, scope string) uint64 {
	t.Helper()
	r := w.run(t, "floors", scope, "--json")
	if r.code != 0 && r.code != 3 {
		t.Fatalf("floors %s: %s", scope, r)
	}
	var doc floorsDoc
	decode(t, r, &doc)
	if len(doc.Floors) != 1 {
		t.Fatalf("floors %s: %+v", scope, doc)
	}
	return doc.Floors[0].Floor
}

// TestStatusAndList: status shows the holder, the token, held or not and
// the time left by the server's clock, for named leases and for all;
// list shows every lease there is; --json parses and says the same.
func TestStatusAndList(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		ctx := context.Background()
		a := w.acquire(t, "job-a", "holder-a", 30*time.Second)
		b := w.acquire(t, "job-b", "holder-b", 30*time.Second)
		if err := w.leases.Release(ctx, b); err != nil {
			t.Fatal(err)
		}

		r := w.run(t, "status", "job-a")
		want(t, r, 0, "NAME", "LEFT (server clock)", "job-a", "held", "holder-a", a.Token.String())

		r = w.run(t, "status", "job-a", "job-b", "never-seen", "--json")
		want(t, r, 0)
		var doc statusDoc
		decode(t, r, &doc)
		if doc.Backend != w.backend || len(doc.Leases) != 3 {
			t.Fatalf("status --json: %+v", doc)
		}
		la, lb, ln := doc.Leases[0], doc.Leases[1], doc.Leases[2]
		if la.Name != "job-a" || la.State != "held" || !la.Held || la.Holder != "holder-a" || la.Token != uint64(a.Token) ||
			la.RemainingMS < 20_000 || la.RemainingMS > 30_000 {
			t.Errorf("job-a: %+v, want held by holder-a with token %d and 20-30 s left", la, a.Token)
		}
		wantB, wantN := "released", "never-acquired"
		if w.backend == "etcd" {
			wantB, wantN = "free", "free" // etcd keeps no record of a released lease
		}
		if lb.State != wantB || lb.Held || ln.State != wantN || ln.Held || ln.Token != 0 {
			t.Errorf("job-b %+v (want %s), never-seen %+v (want %s)", lb, wantB, ln, wantN)
		}

		r = w.run(t, "list", "--json")
		want(t, r, 0)
		decode(t, r, &doc)
		var names []string
		for _, l := range doc.Leases {
			names = append(names, l.Name+"="+l.State)
		}
		wantList := "job-a=held job-b=released"
		if w.backend == "etcd" {
			wantList = "job-a=held"
		}
		if strings.Join(names, " ") != wantList {
			t.Errorf("list: %v, want %s", names, wantList)
		}
		want(t, w.run(t, "status"), 0, "job-a", "holder-a") // no NAME: all
		r = w.run(t, "list", "--limit", "1")
		want(t, r, 0, "job-a", "raise --limit")
		want(t, w.run(t, "list", "job-a"), 2, "list: takes no operands")
	})
}

// TestFloors: floors shows each scope's floor; checked against its
// lease's tokens it is ok, and a floor above every token the lease can
// have issued (here a scope fenced by a made-up token) is a WARNING with
// exit status 3; --json says the same.
func TestFloors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		a := w.acquire(t, "nightly", "holder-a", w.ttl)
		w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: a.Token}, true)
		want(t, w.run(t, "floors", "invoices=nightly"), 0, "invoices", a.Token.String(), "nightly", "ok")
		want(t, w.run(t, "floors", "unwritten=nightly"), 0, "unwritten", "no-floor")

		// A scope fenced by tokens of another token space.
		const far = 900_000_000_000
		w.mustWrite(t, leasecore.Claim{Scope: "mixed", Writer: "elsewhere", Token: far}, true)
		r := w.run(t, "floors", "mixed=nightly", "invoices=nightly")
		want(t, r, command.ExitWarnings, "WARNING: scope mixed: floor 900000000000 is above every token", "token-space mix-up")
		if strings.Contains(r.stdout, "WARNING: scope invoices") {
			t.Errorf("invoices warned about:\n%s", r)
		}

		r = w.run(t, "floors", "--json")
		if w.backend == "etcd" {
			want(t, r, command.ExitWarnings)
		} else {
			want(t, r, 0)
		}
		var doc floorsDoc
		decode(t, r, &doc)
		checks := map[string]string{}
		for _, f := range doc.Floors {
			checks[fmt.Sprintf("%s=%d", f.Scope, f.Floor)] = f.Check
		}
		// Without =LEASE the lease named like the scope is checked: none
		// exists. PostgreSQL then says nothing; etcd's bound is the
		// cluster's revision, which the made-up token is far above.
		wantInvoices, wantMixed := "unchecked", "unchecked"
		if w.backend == "etcd" {
			wantInvoices, wantMixed = "ok", "warning"
		}
		if doc.Backend != w.backend || len(doc.Floors) != 2 ||
			checks[fmt.Sprintf("invoices=%d", a.Token)] != wantInvoices || checks[fmt.Sprintf("mixed=%d", uint64(far))] != wantMixed {
			t.Errorf("floors --json: %+v; want invoices %s, mixed %s", doc, wantInvoices, wantMixed)
		}
		if w.backend == "postgres" {
			// The scope named like its lease is checked without =LEASE.
			w.mustWrite(t, leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: a.Token}, true)
			want(t, w.run(t, "floors", "nightly"), 0, "ok")
			// A lease that was never acquired has issued no token.
			want(t, w.run(t, "floors", "invoices=no-such-lease"), command.ExitWarnings, "has never issued a token")
		}
	})
}

// TestFloorsLeaseServiceUnreachable: with the lease database down the
// floors are still shown, unchecked, with a note, and exit status 0.
func TestFloorsLeaseServiceUnreachable(t *testing.T) {
	w := newPGWorld(t)
	w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: 3}, true)
	flags := append([]string(nil), w.flags...)
	flags[1] = "postgres://nobody@127.0.0.1:1/leases?connect_timeout=2" // the lease DSN: nothing listens there
	r := run(t, append([]string{"floors", "invoices=nightly"}, flags...)...)
	want(t, r, 0, "invoices", "unchecked", "not checked: lease service")
}

// TestAttemptsRejected: a frozen holder's write after a newer holder took
// over — a real fenced transaction with the stale token — is rejected,
// none of its data is stored, and attempts --rejected shows it.
func TestAttemptsRejected(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		a := w.acquire(t, "nightly", "holder-a", w.shortTTL)
		w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: a.Token}, true)
		w.expire(t, a) // holder-a is frozen: no renewals, its lease expires
		b := w.acquire(t, "nightly", "holder-b", w.ttl)
		w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-b", Token: b.Token}, true)
		// holder-a wakes up and writes: rejected by holder-b's token.
		res := w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: a.Token}, false)
		if res.Floor != b.Token {
			t.Fatalf("stale write rejected by floor %d, want %d", res.Floor, b.Token)
		}
		if rows := w.rows(t); strings.Count(rows, "holder-a") != 1 {
			t.Errorf("the stale write stored data: %s", rows)
		}

		r := w.run(t, "attempts", "invoices", "--rejected", "--since", "1h", "--limit", "10", "--json")
		want(t, r, 0)
		var doc attemptsDoc
		decode(t, r, &doc)
		if len(doc.Attempts) != 1 || !doc.Rejected || doc.Scope != "invoices" {
			t.Fatalf("attempts --rejected: %+v, want exactly the one stale write", doc)
		}
		at := doc.Attempts[0]
		if at.Writer != "holder-a" || at.Token != uint64(a.Token) || at.Accepted || at.Floor != uint64(b.Token) ||
			time.Since(at.At) > time.Minute || time.Since(at.At) < -time.Minute {
			t.Errorf("the rejected attempt: %+v, want holder-a's token %d rejected by floor %d just now", at, a.Token, b.Token)
		}
		want(t, w.run(t, "attempts", "invoices", "--rejected"), 0,
			"WRITER", "holder-a", "rejected", a.Token.String(), b.Token.String())
		// Flags before the operand work as well.
		want(t, w.run(t, "attempts", "--rejected", "--since", "all", "invoices"), 0, "holder-a")
		// Since just after the rejection: none.
		r = w.run(t, "attempts", "invoices", "--since", at.At.Add(time.Microsecond).UTC().Format(time.RFC3339Nano), "--json")
		want(t, r, 0)
		decode(t, r, &doc)
		if len(doc.Attempts) != 0 {
			t.Errorf("attempts since just after the rejection: %+v", doc.Attempts)
		}
		want(t, w.run(t, "attempts", "invoices", "--limit", "1"), 0, "raise --limit")
	})
}

// TestAdvance: advance raises a floor to the lease's current token and
// the older holder's writes are rejected from then on; a lower or equal
// TOKEN changes nothing; a TOKEN above every token the lease has issued is
// refused (exit 1, nothing written) unless --force.
func TestAdvance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		ctx := context.Background()
		a := w.acquire(t, "reports", "holder-a", w.ttl)
		if err := w.leases.Release(ctx, a); err != nil {
			t.Fatal(err)
		}
		b := w.acquire(t, "reports", "holder-b", w.ttl)
		tb := b.Token.String()

		r := w.run(t, "advance", "reports", tb)
		want(t, r, 0, "scope reports: floor - -> "+tb, "tokens below "+tb+" are rejected")
		w.mustWrite(t, leasecore.Claim{Scope: "reports", Writer: "holder-a", Token: a.Token}, false)
		want(t, w.run(t, "advance", "reports", tb), 0, "floor was already "+tb)
		want(t, w.run(t, "advance", "reports", a.Token.String()), 0, "floor is already "+tb+", above "+a.Token.String()+": nothing changed")

		before := w.snapshot(t)
		above := strconv.FormatUint(uint64(b.Token)+1_000_000_000, 10)
		want(t, w.run(t, "advance", "reports", above), 1, "is above every token lease \"reports\" can have issued", "nothing changed")
		if after := w.snapshot(t); after != before {
			t.Errorf("a refused advance wrote:\nbefore %s\nafter %s", before, after)
		}
		r = w.run(t, "advance", "reports", above, "--force", "--json")
		want(t, r, 0)
		var doc advanceDoc
		decode(t, r, &doc)
		if !doc.Accepted || doc.FloorBefore != uint64(b.Token) || doc.Floor != doc.Token || strconv.FormatUint(doc.Token, 10) != above {
			t.Errorf("advance --force --json: %+v", doc)
		}
		w.mustWrite(t, leasecore.Claim{Scope: "reports", Writer: "holder-b", Token: b.Token}, false)

		// --lease names the lease of a scope named otherwise.
		want(t, w.run(t, "advance", "other-scope", tb, "--lease", "reports", "--writer", "ops-jane"), 0, "floor - -> "+tb)
		if got := w.floorOf(t, "other-scope"); got != uint64(b.Token) {
			t.Errorf("other-scope's floor %d, want %d", got, b.Token)
		}
		if w.backend == "postgres" {
			// No lease of the scope's name: not checked, and said so.
			want(t, w.run(t, "advance", "lonely", "3"), 0, "no lease named \"lonely\"", "TOKEN not checked", "floor - -> 3")
		}
	})
}

// TestBreak: break ends the holding period of a live holder and fences
// it off in one command: the holder's renew fails as lost, its fenced
// write is rejected, the lease is free, the floor is the operator's new
// token, and the next holder gets a larger token that the fence accepts.
// Tokens never go down; the PostgreSQL lease row stays. Without a
// confirmation nothing is written.
func TestBreak(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		ctx := context.Background()
		a := w.acquire(t, "nightly", "holder-a", w.ttl)
		w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: a.Token}, true)

		before := w.snapshot(t)
		want(t, w.run(t, "break", "nightly", "--scope", "invoices"), 2, "refusing without --yes or --confirm")
		want(t, w.run(t, "break", "nightly", "--scope", "invoices", "--confirm", "nightly-typo"), 2, `--confirm "nightly-typo" does not match`)
		want(t, w.run(t, "break", "nightly", "--yes"), 2, "--scope is required")
		want(t, w.run(t, "break", "nightly", "--yes", "--scope", "bad\x01scope"), 2, "invalid --scope")
		if w.backend == "etcd" {
			want(t, w.run(t, "break", "nightly", "--yes", "--scope", "invoices", "--ttl", "1500ms"), 2, "--ttl 1.5s: must be whole seconds")
		}
		if after := w.snapshot(t); after != before {
			t.Fatalf("a refused break wrote:\nbefore %s\nafter %s", before, after)
		}

		r := w.run(t, "break", "nightly", "--scope", "invoices", "--confirm", "nightly")
		want(t, r, 0, "break nightly ("+w.backend+")", `ended:    holder "holder-a", token `+a.Token.String(),
			`as "leasefence-operator@testhost"`, "scope invoices: floor", "released: token")
		st, err := w.leases.Inspect(ctx, "nightly")
		if err != nil {
			t.Fatal(err)
		}
		if st.Held {
			t.Errorf("the lease is still held after break: %+v", st)
		}
		if w.backend == "postgres" && (!st.Exists || !st.Released || st.Token <= a.Token) {
			t.Errorf("the lease row after break: %+v, want it kept, released, with a token above %d", st, a.Token)
		}
		floor := w.floorOf(t, "invoices")
		if floor <= uint64(a.Token) || (w.backend == "postgres" && floor != uint64(a.Token)+1) {
			t.Errorf("floor after break %d, want the operator's new token above %d", floor, a.Token)
		}
		if _, err := w.leases.Renew(ctx, a); !errors.Is(err, leasecore.ErrLost) {
			t.Errorf("the broken holder's renew: %v, want ErrLost", err)
		}
		// The broken holder does not notice and writes: rejected.
		w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: a.Token}, false)
		want(t, w.run(t, "attempts", "invoices", "--rejected"), 0, "holder-a")
		// The operator's advance is in the log too, accepted.
		r = w.run(t, "attempts", "invoices", "--json")
		var log attemptsDoc
		decode(t, r, &log)
		found := false
		for _, at := range log.Attempts {
			found = found || (at.Writer == "leasefence-operator@testhost" && at.Accepted && at.Token == floor)
		}
		if !found {
			t.Errorf("the operator's advance is not in the attempt log: %+v", log.Attempts)
		}
		// The next holder acquires at once, with a larger token, and writes.
		c := w.acquire(t, "nightly", "holder-c", w.ttl)
		if uint64(c.Token) <= floor {
			t.Errorf("the next holder's token %d is not above the floor %d", c.Token, floor)
		}
		w.mustWrite(t, leasecore.Claim{Scope: "invoices", Writer: "holder-c", Token: c.Token}, true)

		// --json, two scopes, one of them fenced by another token space:
		// exit 3, that scope unchanged, the lease released all the same.
		w.mustWrite(t, leasecore.Claim{Scope: "mixed", Writer: "elsewhere", Token: 900_000_000_000}, true)
		r = w.run(t, "break", "nightly", "--scope", "invoices", "--scope", "mixed", "--yes", "--holder", "ops-jane", "--json")
		want(t, r, command.ExitWarnings)
		var doc breakDoc
		decode(t, r, &doc)
		if doc.Lease != "nightly" || !doc.Took || !doc.Released || doc.Holder != "ops-jane" || doc.Token <= uint64(c.Token) ||
			doc.Ended.Holder != "holder-c" || doc.Ended.Token != uint64(c.Token) || !doc.Ended.Held || len(doc.Scopes) != 2 ||
			!doc.Scopes[0].Advanced || doc.Scopes[0].Floor != doc.Token ||
			doc.Scopes[1].Advanced || doc.Scopes[1].Floor != 900_000_000_000 || !strings.Contains(doc.Scopes[1].Warning, "token-space mix-up") {
			t.Errorf("break --json: %+v", doc)
		}
		if st, err := w.leases.Inspect(ctx, "nightly"); err != nil || st.Held {
			t.Errorf("after the second break: %+v, %v; want free", st, err)
		}

		// A floor that another lease service's token raised, and says so
		// (the fence stores the claim's token space): named as such.
		w.mustWrite(t, leasecore.Claim{Scope: "foreign", Writer: "elsewhere", Token: 900_000_000_000, Space: "etcd:0123abcd"}, true)
		want(t, w.run(t, "break", "nightly", "--scope", "foreign", "--yes"), command.ExitWarnings,
			"scope foreign: WARNING: floor 900000000000 was not changed", "etcd:0123abcd")

		// A lease nobody holds: break takes and releases it, and fences.
		r = w.run(t, "break", "nightly", "--scope", "invoices", "--yes")
		want(t, r, 0, "ended:    nothing was held")
	})
}

// TestMigrateAndSchema: migrate creates the tables, is idempotent, and
// works in another schema; before it, reads fail with exit 1 naming the
// missing table; schema prints the DDL migrate runs, with no server.
func TestMigrateAndSchema(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		leaseDSN, resDSN := clitest.CreateDB(t, "mlease"), clitest.CreateDB(t, "mres")
		flags := []string{"--lease-dsn", leaseDSN, "--resource-dsn", resDSN}
		r := run(t, append([]string{"status"}, flags...)...)
		want(t, r, 1, "leasefence: status:", "lease")
		want(t, run(t, append([]string{"migrate"}, flags...)...), 0, "leasefence.lease ready", "leasefence.fence_floor")
		want(t, run(t, append([]string{"migrate", "--json"}, flags...)...), 0, `"done"`)
		want(t, run(t, append([]string{"status"}, flags...)...), 0, "NAME")
		want(t, run(t, append([]string{"migrate", "--schema", "jobs"}, flags...)...), 0, "jobs.lease ready", "jobs.fence_floor")
		want(t, run(t, append([]string{"floors", "--schema", "jobs"}, flags...)...), 0, "SCOPE")
		// One DSN for both.
		want(t, run(t, "migrate", "--dsn", leaseDSN), 0, "leasefence.fence_floor")
		want(t, run(t, "migrate", "extra", "--dsn", leaseDSN), 2, "migrate: takes no operands")
	})
	t.Run("etcd", func(t *testing.T) {
		w := newEtcdWorld(t)
		want(t, w.run(t, "migrate"), 0, "nothing to migrate")
	})
	t.Run("schema", func(t *testing.T) {
		r := run(t, "schema")
		want(t, r, 0, "CREATE TABLE IF NOT EXISTS leasefence.lease", "CREATE TABLE IF NOT EXISTS leasefence.fence_floor",
			"CREATE TABLE IF NOT EXISTS leasefence.write_attempt")
		r = run(t, "schema", "resource", "--schema", "jobs")
		want(t, r, 0, "jobs.fence_floor")
		if strings.Contains(r.stdout, "jobs.lease (") || strings.Contains(r.stdout, "leasefence.") {
			t.Errorf("schema resource --schema jobs shows the lease table or the default schema:\n%s", r)
		}
		r = run(t, "schema", "--json")
		want(t, r, 0)
		var doc struct {
			Schema   string `json:"schema"`
			Lease    string `json:"lease_ddl"`
			Resource string `json:"resource_ddl"`
		}
		decode(t, r, &doc)
		if doc.Schema != "leasefence" || !strings.Contains(doc.Lease, "leasefence.lease") || !strings.Contains(doc.Resource, "fence_floor") {
			t.Errorf("schema --json: %+v", doc)
		}
		want(t, run(t, "schema", "--backend", "etcd"), 2, "etcd has no DDL")
		want(t, run(t, "schema", "--schema", "Bad-Name"), 2, `invalid schema "Bad-Name"`)
		want(t, run(t, "schema", "tables"), 2, `unknown part "tables"`)
	})
}

// TestPruneAttempts: prune-attempts deletes the attempt log's entries
// older than --older-than, of the named scopes or of every scope, and
// keeps the floors.
func TestPruneAttempts(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		for _, scope := range []string{"invoices", "reports"} {
			w.mustWrite(t, leasecore.Claim{Scope: scope, Writer: "holder-b", Token: 5}, true)
			w.mustWrite(t, leasecore.Claim{Scope: scope, Writer: "holder-a", Token: 4}, false)
		}
		want(t, w.run(t, "prune-attempts", "invoices"), 2, "--older-than is required")
		want(t, w.run(t, "prune-attempts", "--older-than", "1h", "invoices"), 0, "scope invoices: 0 entries deleted")
		time.Sleep(100 * time.Millisecond)
		want(t, w.run(t, "prune-attempts", "--older-than", "50ms", "invoices"), 0, "scope invoices: 1 entry deleted")
		r := w.run(t, "attempts", "invoices", "--since", "all", "--json")
		var doc attemptsDoc
		decode(t, r, &doc)
		if len(doc.Attempts) != 0 {
			t.Errorf("invoices' log after the prune: %+v", doc.Attempts)
		}
		r = w.run(t, "prune-attempts", "--older-than", "50ms", "--json")
		want(t, r, 0)
		var pruned struct {
			Scopes []struct {
				Scope   string `json:"scope"`
				Deleted int64  `json:"deleted"`
			} `json:"scopes"`
			Deleted int64 `json:"deleted"`
		}
		decode(t, r, &pruned)
		if pruned.Deleted != 1 || len(pruned.Scopes) != 2 {
			t.Errorf("prune of every scope: %+v, want reports' one entry", pruned)
		}
		if got := w.floorOf(t, "invoices"); got != 5 {
			t.Errorf("invoices' floor after the prune: %d, want 5", got)
		}
	})
}
