//go:build linux

package fencepg_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestConformanceDocker runs the conformance suite (driver pgx) against fencepg on a cluster of
// pgtemp's Docker provider: PostgreSQL in a container on the host's network, listening on
// 127.0.0.1, F8 included (the postmaster, PID 1 of the container, is stopped immediately and the
// container started again on the same bind-mounted data directory).
//
// The image is pgtemp.LocalDockerImage, built by scripts/ensure-docker.sh (which `make test`
// runs) from the PostgreSQL binaries of this machine, or the one LEASEFENCE_PG_DOCKER names;
// nothing is pulled. Without an engine or the image the test skips, except under CI, where it
// fails.
func TestConformanceDocker(t *testing.T) {
	image := dockerImageForTest(t)
	t.Setenv("LEASEFENCE_PG_URL", "") // WithDocker wins anyway; keeps the intent plain
	cluster := pgtemp.StartTB(t, pgtemp.WithDocker(image))
	t.Logf("PostgreSQL %s in container %s (image %s) on %s:%d", cluster.Version(), cluster.Container(), image,
		cluster.Host(), cluster.Port())
	leaseDB, resDB := "lease_docker", "res_docker"
	for _, db := range []string{leaseDB, resDB} {
		if err := cluster.CreateDatabase(t.Context(), db); err != nil {
			t.Fatal(err)
		}
	}
	conformance.Run(t, pgconformance.New(pgconformance.Config{
		Driver:      pgconformance.DriverPgx,
		LeaseDSN:    cluster.DSN(leaseDB),
		ResourceDSN: cluster.DSN(resDB),
		HolderArgs:  []string{"-test.run=^$"}, // TestMain turns the binary into the holder
		Cluster:     cluster,                  // F8 crashes it; this test owns it
	}))

	// F8 ran on this cluster, not skipped: the server's log shows the crash recovery.
	log, err := os.ReadFile(filepath.Join(filepath.Dir(cluster.DataDir()), "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("automatic recovery in progress")) {
		t.Errorf("the container's server log shows no crash recovery: F8 did not crash this cluster")
	}
}

// dockerImageForTest returns the image to run, or skips when no engine or image is there (fails
// when CI is set: CI installs both, and a skip would hide that they broke).
func dockerImageForTest(t *testing.T) string {
	t.Helper()
	image := strings.TrimSpace(os.Getenv("LEASEFENCE_PG_DOCKER"))
	switch image {
	case "", "0":
		image = pgtemp.LocalDockerImage
	case "1":
		image = pgtemp.DefaultDockerImage
	}
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + " (scripts/ensure-docker.sh sets both up; make test runs it)"
		if os.Getenv("CI") != "" {
			t.Fatal("CI: " + msg)
		}
		t.Skip(msg)
	}
	pool, err := dockertest.NewPool("")
	if err != nil {
		unavailable("no Docker client: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := pool.Client.PingWithContext(ctx); err != nil {
		unavailable("no Docker engine at %s: %v", pool.Client.Endpoint(), err)
	}
	if _, err := pool.Client.InspectImage(image); err != nil {
		unavailable("image %s not in the Docker engine: %v", image, err)
	}
	return image
}
