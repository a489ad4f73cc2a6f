package fencepg_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// migrator is one process's view of both databases.
type migrator struct {
	lease, res pgopen.Pool
}

func (m migrator) migrate(ctx context.Context) error {
	leases, err := m.lease.LeaseStore()
	if err != nil {
		return err
	}
	controls, err := m.res.Controls()
	if err != nil {
		return err
	}
	if err := leases.Migrate(ctx); err != nil {
		return err
	}
	return controls.Migrate(ctx) // fencepg's resource tables, then published
}

// TestMigrate: before Migrate the stores say so (ErrSchema, "run
// Migrate"); Migrate is idempotent; two processes migrating at once both
// succeed, on empty databases and on migrated ones.
func TestMigrate(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		leaseDSN, resDSN := pgtest.CreateDB(t, "mlease"), pgtest.CreateDB(t, "mres")
		procs := []migrator{
			{pgtest.Open(t, driver, leaseDSN, 2), pgtest.Open(t, driver, resDSN, 2)},
			{pgtest.Open(t, driver, leaseDSN, 2), pgtest.Open(t, driver, resDSN, 2)},
		}
		leases, _ := procs[0].lease.LeaseStore()
		res, _ := procs[0].res.Resource()

		_, err := leases.Acquire(ctx, "report-job", "holder-a", time.Second)
		wantSchemaErr(t, err)
		_, err = res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1})
		wantSchemaErr(t, err)
		_, err = res.Floor(ctx, "s")
		wantSchemaErr(t, err)

		const rounds = 5
		for round := range rounds {
			if round > 0 {
				// Empty databases again, so every round races the creation.
				for _, drop := range []struct {
					p    pgopen.Pool
					stmt string
				}{
					{procs[0].lease, "DROP TABLE leasefence.lease"},
					{procs[0].res, "DROP TABLE leasefence.fence_floor, leasefence.report_part, leasefence.write_attempt, leasefence.published"},
				} {
					if _, err := pgtest.DB(drop.p).Exec(ctx, drop.stmt); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Twice per round: the second runs on migrated databases.
			for range 2 {
				start := make(chan struct{})
				errs := make([]error, len(procs))
				var wg sync.WaitGroup
				for i, p := range procs {
					wg.Go(func() {
						<-start
						errs[i] = p.migrate(ctx)
					})
				}
				close(start)
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("round %d: concurrent Migrate: %v", round, err)
				}
			}
		}

		g, err := leases.Acquire(ctx, "report-job", "holder-a", time.Second)
		if err != nil || g.Token != 1 {
			t.Fatalf("acquire after Migrate: %+v, %v", g, err)
		}
		if r, err := res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1}); err != nil || !r.Accepted {
			t.Fatalf("write after Migrate: %+v, %v", r, err)
		}
	})
}

func wantSchemaErr(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, leasecore.ErrSchema) || !strings.Contains(err.Error(), "run Migrate") ||
		!strings.HasPrefix(err.Error(), "fencepg: ") {
		t.Fatalf("before Migrate: got %v, want an error wrapping ErrSchema saying \"run Migrate\"", err)
	}
}
