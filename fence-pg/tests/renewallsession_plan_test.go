package fencepg_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
)

// TestRenewAllSessionPlanIsNotQuadratic: RenewAll with holder sessions,
// in its full check (RenewAllSession, the statement that reads every
// grant's lease row), must not compare every input name with every lease
// row or every other input name, whatever the lease table's statistics
// say. Its first form was planned in every state with a nested loop anti
// join that scanned the names found once per input name (499,500 pairs
// for 1,000 renewed names), and, with the statistics set up here (the
// lease table analyzed while it held only other holders' names without
// sessions, so that the holder's names on a session are estimated at one
// row), with a nested loop of a sequential scan of the lease table and the
// input (999,000 pairs): 100-250 ms instead of 3. With 1,000 names on the
// holder's session, it reads the executed plans, custom and generic, of
// the statement the store sends: every name is looked up through the
// primary key, and no node discards more rows by a join filter than there
// are names. Rows and plan nodes, not time. (The first form fails it, and
// so does either half of the fix alone.)
func TestRenewAllSessionPlanIsNotQuadratic(t *testing.T) {
	const n = 1000
	f := newSessionFixture(t, "pgx")
	ctx := t.Context()
	if _, err := f.leaseDB.Exec(ctx, `INSERT INTO leasefence.lease (name, holder, token, expires_at)
		SELECT format('plan-other-%s', g), format('plan-other-holder-%s', g % 1000), 1, now() + interval '1 hour'
		  FROM generate_series(1, 10000) AS g`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.leaseDB.Exec(ctx, `ANALYZE leasefence.lease`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.leaseDB.Exec(ctx, `ANALYZE leasefence.holder_session`); err != nil {
		t.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("plan-shard-%04d", i)
	}
	gs, errs, err := f.sess.AcquireAll(ctx, names, "plan-holder", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
	}
	type input struct {
		Name  string `json:"name"`
		Token int64  `json:"token"`
		TTL   int64  `json:"ttl_us"`
	}
	in := make([]input, n)
	for i, g := range gs {
		in[i] = input{g.Name, int64(g.Token), g.TTL.Microseconds()}
	}
	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, f.leaseDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `PREPARE renew_all_session(text, json) AS `+pgsql.RenewAllSession); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		// EXPLAIN ANALYZE runs the statement: the session is extended again.
		plan := executedPlan(t, conn, mode, `renew_all_session('plan-holder', `+sqlLiteral(string(js))+`)`)
		byName := false
		for _, node := range plan {
			if node.JoinFilterRemoved > n {
				t.Fatalf("%s: a join filter discarded %d rows for %d names: the plan compares names pairwise\n%s",
					mode, node.JoinFilterRemoved, n, renderPlan(plan))
			}
			if node.Relation == "lease" && strings.HasPrefix(node.IndexCond, "(name = ") && node.Loops >= n {
				byName = true
			}
		}
		if !byName {
			t.Fatalf("%s: the plan does not look each name up through the primary key\n%s", mode, renderPlan(plan))
		}
	}
	// The statement still renews: every grant is held, and the session was
	// extended (one row back per session, none per grant).
	renewed, lost, err := f.sess.RenewAll(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range gs {
		if lost[i] != nil || renewed[i].Token != gs[i].Token {
			t.Fatalf("%s: renewed %+v lost %v", gs[i].Name, renewed[i], lost[i])
		}
	}
}
