package fencepg_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/leasecore"
)

// planNode is one node of an executed plan (EXPLAIN (ANALYZE, FORMAT
// JSON)), with the counts EXPLAIN reports per loop multiplied back by the
// node's loops: what the node did in all.
type planNode struct {
	Type, Relation, IndexCond string
	Loops, Rows               int64
	JoinFilterRemoved         int64 // rows discarded by a join filter, all loops
	FilterRemoved             int64 // rows discarded by a filter, all loops
	Depth                     int
}

// executedPlan runs EXPLAIN (ANALYZE, FORMAT JSON) of the EXECUTE of a
// prepared statement (execute: "name(args...)") on conn with
// plan_cache_mode set to mode, and returns its nodes in depth-first order.
// ANALYZE runs the statement: whatever it writes, it writes.
func executedPlan(t *testing.T, conn *pgx.Conn, mode, execute string) []planNode {
	t.Helper()
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	var out string
	if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, FORMAT JSON) EXECUTE `+execute).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plans []struct{ Plan map[string]any }
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN's JSON: %v: %.200s", err, out)
	}
	var nodes []planNode
	var walk func(m map[string]any, depth int)
	walk = func(m map[string]any, depth int) {
		num := func(k string) int64 { v, _ := m[k].(float64); return int64(v) }
		str := func(k string) string { v, _ := m[k].(string); return v }
		loops := num("Actual Loops")
		nodes = append(nodes, planNode{Type: str("Node Type"), Relation: str("Relation Name"), IndexCond: str("Index Cond"),
			Loops: loops, Rows: num("Actual Rows") * loops, JoinFilterRemoved: num("Rows Removed by Join Filter") * loops,
			FilterRemoved: num("Rows Removed by Filter") * loops, Depth: depth})
		children, _ := m["Plans"].([]any)
		for _, c := range children {
			if cm, ok := c.(map[string]any); ok {
				walk(cm, depth+1)
			}
		}
	}
	walk(plans[0].Plan, 0)
	return nodes
}

// renderPlan shows nodes for a failure message.
func renderPlan(nodes []planNode) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", n.Depth), n.Type)
		if n.Relation != "" {
			b.WriteString(" on " + n.Relation)
		}
		if n.IndexCond != "" {
			b.WriteString(" by " + n.IndexCond)
		}
		fmt.Fprintf(&b, " (loops=%d rows=%d", n.Loops, n.Rows)
		if n.JoinFilterRemoved > 0 {
			fmt.Fprintf(&b, " removed by join filter=%d", n.JoinFilterRemoved)
		}
		if n.FilterRemoved > 0 {
			fmt.Fprintf(&b, " removed by filter=%d", n.FilterRemoved)
		}
		b.WriteString(")\n")
	}
	return b.String()
}

// sqlLiteral quotes s as an SQL string literal.
func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// skewPlanStatistics gives the planner wrong estimates for a holder's
// names: 10,000 lease rows of 1,000 other holders without sessions, then
// ANALYZE of the lease and session tables, before the holder's own names
// arrive. The holder's rows are then estimated at about one, the state in
// which a statement that joins its input to the lease table can be planned
// as a nested loop over every pair.
func skewPlanStatistics(t *testing.T, f *fixture) {
	t.Helper()
	ctx := t.Context()
	for _, stmt := range []string{`INSERT INTO leasefence.lease (name, holder, token, expires_at)
		SELECT format('plan-other-%s', g), format('plan-other-holder-%s', g % 1000), 1, now() + interval '1 hour'
		  FROM generate_series(1, 10000) AS g`,
		`ANALYZE leasefence.lease`, `ANALYZE leasefence.holder_session`} {
		if _, err := f.leaseDB.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
}

// checkLooksUpEachName prepares stmt, a RenewAll statement taking
// (holder text, grants json), runs it for gs through EXPLAIN ANALYZE with
// custom and generic plans, and fails unless every name is looked up
// through the lease table's primary key and no node discards more rows by
// a join filter than there are grants. EXPLAIN ANALYZE runs the statement:
// the grants are renewed again.
func checkLooksUpEachName(t *testing.T, f *fixture, stmt string, gs []leasecore.Grant) {
	t.Helper()
	ctx := t.Context()
	type input struct {
		Name  string `json:"name"`
		Token int64  `json:"token"`
		TTL   int64  `json:"ttl_us"`
	}
	in := make([]input, len(gs))
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
	if _, err := conn.Exec(ctx, `PREPARE renew_all(text, json) AS `+stmt); err != nil {
		t.Fatal(err)
	}
	n := int64(len(gs))
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		plan := executedPlan(t, conn, mode, `renew_all(`+sqlLiteral(gs[0].Holder)+`, `+sqlLiteral(string(js))+`)`)
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
}
