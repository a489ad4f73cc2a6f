package fencepg_test

import (
	"fmt"
	"testing"
	"time"

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
	skewPlanStatistics(t, f.fixture)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("plan-shard-%04d", i)
	}
	gs, errs, err := f.sess.AcquireAll(t.Context(), names, "plan-holder", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
	}
	checkLooksUpEachName(t, f.fixture, pgsql.RenewAllSession, gs)
	renewAllWant(t, f.sess, gs, "") // every grant is still held
}
