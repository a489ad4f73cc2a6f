package fencepg_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
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
// input: 999,000 pairs for 1,000 names, 250-400 ms instead of 15 (seen
// after autovacuum's first ANALYZE of a table the names had just been
// renewed in; an ANALYZE of its own does not reliably give the same
// estimate, so the test checks the plan's shape instead of waiting for
// the bad one). With 1,000 names renewed a few times and the table
// analyzed, it reads the executed plans, custom and generic, of the
// statement the store sends: the leases are looked up by name through the
// primary key, and no node discards more rows by a join filter than there
// are names. Rows and plan nodes, not time: a loaded machine cannot make
// it fail or pass. (The first form fails it: a hash join of a sequential
// scan, no lookup by name.)
func TestRenewAllPlanIsNotQuadratic(t *testing.T) {
	const n = 1000
	f := newFixture(t, "pgx")
	ctx := t.Context()
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
		in = append(in, input{g.Name, int64(g.Token), int64(time.Hour / time.Microsecond)})
	}
	for range 6 {
		if _, _, err := f.leases.RenewAll(ctx, gs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.leaseDB.Exec(ctx, `ANALYZE leasefence.lease`); err != nil {
		t.Fatal(err)
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
	removed := regexp.MustCompile(`Rows Removed by Join Filter: (\d+)`)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		// EXPLAIN ANALYZE runs the statement: the names are renewed again.
		rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE renew_all('plan-holder', '`+
			strings.ReplaceAll(string(js), "'", "''")+`')`)
		if err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for _, m := range removed.FindAllStringSubmatch(plan.String(), -1) {
			if k, _ := strconv.Atoi(m[1]); k > n {
				t.Fatalf("%s: a join filter discarded %d rows for %d names: the plan compares names pairwise\n%s", mode, k, n, plan.String())
			}
		}
		if !strings.Contains(plan.String(), "Index Cond: (name = ") {
			t.Fatalf("%s: the plan does not look the leases up by name\n%s", mode, plan.String())
		}
	}
	// The statement still renews: every name is held with the renewed TTL.
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
