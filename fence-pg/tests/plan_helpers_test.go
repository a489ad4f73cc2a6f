package fencepg_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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
