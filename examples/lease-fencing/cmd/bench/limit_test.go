package main

import "testing"

// TestLimitGuardAborts: pipeline_limit_guard's check aborts its pipeline,
// so the write behind it does not commit, when the floor differs from the
// token and when the scope has no floor row; with the floor at the token
// the write commits. Otherwise it would not be a limit for the fenced
// pipeline, whose check must stop the write.
func TestLimitGuardAborts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server")
	}
	ctx := t.Context()
	e, err := startPG(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.close(); err != nil {
			t.Error(err)
		}
	})
	written := func(scope string) bool {
		var n int
		if err := e.resPool.QueryRow(ctx, `SELECT count(*) FROM leasefence.report_part WHERE scope = $1`, scope).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	for _, c := range []struct {
		name, scope string
		token       int64
		accepted    bool
	}{
		{"floor at the token", "bench-limit-guard", 1, true},
		{"floor above the token", "bench-limit-write", 0, false},
		{"floor below the token", "bench-limit-tx", 2, false},
		{"no floor row", "bench-limit-none", 1, false},
	} {
		err := limitPipeline(ctx, e.resPool, c.scope, "summary", limitGuard, c.token)
		if got := err == nil; got != c.accepted || written(c.scope) != c.accepted {
			t.Errorf("%s: pipeline error %v, part written %v; want accepted %v", c.name, err, written(c.scope), c.accepted)
		}
	}
}
