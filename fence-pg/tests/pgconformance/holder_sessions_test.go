package pgconformance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
)

// TestSharedLeasesConfig: Config.SharedLeases names the configuration
// "postgres/<driver>/holder-sessions", makes every lease store the harness
// opens use holder sessions (a name it acquires hangs on a session row;
// the long transaction's acquire works in the mode, F2 in the suite shows
// its verdict; the holder processes are told to, their spec says so), and
// needs no trait of its own: the same abilities are absent as without it.
func TestSharedLeasesConfig(t *testing.T) {
	ctx := context.Background()
	base := pgconformance.Config{
		Driver: pgconformance.DriverPgx, LeaseDSN: pgtest.CreateDB(t, "lease_hs"), ResourceDSN: pgtest.CreateDB(t, "res_hs"),
		HolderArgs: []string{"-test.run=^$"},
	}
	plainH, err := pgconformance.New(base)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plain := plainH.Traits()
	if err := plainH.Close(); err != nil {
		t.Fatal(err)
	}

	cfg := base
	cfg.SharedLeases = true
	h, err := pgconformance.New(cfg)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tr := h.Traits()
	if tr.Name != "postgres/pgx/holder-sessions" || tr.TokenStep != 1 || tr.MinTTL != plain.MinTTL {
		t.Errorf("traits: %+v", tr)
	}
	if len(tr.Absent) != len(plain.Absent) {
		t.Errorf("absent with holder sessions %v, without %v: the mode declares no ability of its own", tr.Absent, plain.Absent)
	}

	// Every lease store of the harness is in the mode: a name it acquires
	// hangs on a session row.
	l, err := h.OpenLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "job", "holder-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	tx, err := h.(conformance.LongTransactions).BeginLongTransaction(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Acquire(ctx, "in-tx", "holder-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	admin, err := pgopen.Open(ctx, pgopen.Pgx, cfg.LeaseDSN, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var onSession int
	if err := pgtest.DB(admin).QueryRow(ctx, `SELECT count(*) FROM leasefence.lease WHERE name = 'job' AND session_id IS NOT NULL`).Scan(&onSession); err != nil || onSession != 1 {
		t.Fatalf("the harness's acquire: %d rows on a session, %v; want 1", onSession, err)
	}

	cmd, err := h.(conformance.HolderProcesses).HolderCommand(ctx, conformance.KindFenced)
	if err != nil {
		t.Fatal(err)
	}
	var spec string
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, pgconformance.HolderEnv+"="); ok {
			spec = v
		}
	}
	if !strings.Contains(spec, `"shared_leases":true`) {
		t.Fatalf("holder spec %s: the holder process would not use shared leases", spec)
	}
}
