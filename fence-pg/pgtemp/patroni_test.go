//go:build unix

package pgtemp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestPatroniFailover starts a synchronous Patroni cluster, commits a row on the leader, kills
// the leader's host (Patroni and PostgreSQL, SIGKILL) and checks that Patroni promotes a replica
// that has the row and accepts writes, and that the multi-host DSN finds it.
func TestPatroniFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Patroni cluster")
	}
	ctx := t.Context()
	pc, err := pgtemp.StartPatroni(ctx, true, pgtemp.WithLog(t.Output()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pc.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := pc.HoldBackReplicas(ctx); !errors.Is(err, pgtemp.ErrNotSupported) {
		t.Errorf("HoldBackReplicas in synchronous mode: %v, want ErrNotSupported", err)
	}
	old, err := pc.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec := func(dsn, sql string, args ...any) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, sql, args...)
		return err
	}
	if err := exec(pc.DSN("postgres"), "CREATE TABLE acked (v int); INSERT INTO acked VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := pc.KillMember(old); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	next, err := pc.WaitLeader(wctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s killed; %s leads after %v", old, next, time.Since(t0).Round(time.Millisecond))
	conn, err := pgx.Connect(ctx, pc.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	if err := conn.QueryRow(ctx, "INSERT INTO acked VALUES (2); SELECT count(*) FROM acked").Scan(&n); err != nil {
		// pgx runs one statement with QueryRow: do it in two.
		if _, err := conn.Exec(ctx, "INSERT INTO acked VALUES (2)"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	if n != 2 {
		t.Fatalf("after the failover the new leader has %d rows, want 2 (the acknowledged one and the new one)", n)
	}
}

// TestStartPatroniRefusesOptions: the options a Patroni cluster cannot honour fail before anything
// starts, naming the option.
func TestStartPatroniRefusesOptions(t *testing.T) {
	for _, tc := range []struct {
		opt  pgtemp.Option
		name string
		want error
	}{
		{pgtemp.WithPort(5999), "WithPort", pgtemp.ErrInvalidOption},
		{pgtemp.WithSetting("work_mem", "8MB"), "WithSetting", pgtemp.ErrInvalidOption},
		{pgtemp.WithDocker(pgtemp.DefaultDockerImage), "WithDocker", pgtemp.ErrNotSupported},
	} {
		pc, err := pgtemp.StartPatroni(t.Context(), true, tc.opt)
		if pc != nil {
			_ = pc.Stop()
		}
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("StartPatroni with %s: %v, want an error naming %s and wrapping %v", tc.name, err, tc.name, tc.want)
		}
	}
}
