package fencepg_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
)

// TestRenewAllPlanIsNotQuadratic: RenewAll of many names (without holder
// sessions) must not compare every input name with every lease row,
// whatever the lease table's statistics say. Its first form (UPDATE ...
// FROM input) was planned, once the statistics estimated the holder's
// unexpired rows at one, as a nested loop of a sequential scan and the
// input: 999,000 pairs for 1,000 names, 250-400 ms instead of 15 (make
// bench's renew_1000_leases_per_lease after autovacuum's first ANALYZE).
// Statistics cannot be steered to exactly that estimate, so the test
// checks the plan's shape in a state with wrong ones (the table analyzed
// while it held only other holders' names, as
// TestRenewAllSessionPlanIsNotQuadratic does): in the executed plans,
// custom and generic, of the statement the store sends for 1,000 names,
// every name is looked up through the primary key, and no node discards
// more rows by a join filter than there are names. Rows and plan nodes,
// not time. (The first form fails it: no lookup by name.)
func TestRenewAllPlanIsNotQuadratic(t *testing.T) {
	const n = 1000
	f := newFixture(t, "pgx")
	ctx := t.Context()
	if _, err := f.leaseDB.Exec(ctx, `INSERT INTO leasefence.lease (name, holder, token, expires_at)
		SELECT format('plan-other-%s', g), format('plan-other-holder-%s', g % 1000), 1, now() + interval '1 hour'
		  FROM generate_series(1, 10000) AS g`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.leaseDB.Exec(ctx, `ANALYZE leasefence.lease`); err != nil {
		t.Fatal(err)
	}
	type input struct {
		Name  string `json:"name"`
		Token int64  `json:"token"`
		TTL   int64  `json:"ttl_us"`
	}
	var (
		in []input
		gs []leasecore.Grant
	)
	for i := range n {
		g, err := f.leases.Acquire(ctx, fmt.Sprintf("plan-shard-%04d", i), "plan-holder", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
		in = append(in, input{g.Name, int64(g.Token), g.TTL.Microseconds()})
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
	if _, err := conn.Exec(ctx, `PREPARE renew_all(text, json) AS `+pgsql.RenewAll); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		// EXPLAIN ANALYZE runs the statement: the names are renewed again.
		plan := executedPlan(t, conn, mode, `renew_all('plan-holder', `+sqlLiteral(string(js))+`)`)
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
	// The statement still renews: every name is held.
	renewed, lost, err := f.leases.RenewAll(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range gs {
		if lost[i] != nil || renewed[i].Token != gs[i].Token {
			t.Fatalf("%s: renewed %+v lost %v", gs[i].Name, renewed[i], lost[i])
		}
	}
}
