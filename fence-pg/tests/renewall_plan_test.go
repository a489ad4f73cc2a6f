package fencepg_test

import (
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
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
	f := newFixture(t, "pgx")
	skewPlanStatistics(t, f)
	gs := acquireShards(t, f.leases, "plan-holder", 1000, time.Hour)
	checkLooksUpEachName(t, f, pgsql.RenewAll, gs)
	renewAllWant(t, f.leases, gs, "") // the statement still renews every name
}
