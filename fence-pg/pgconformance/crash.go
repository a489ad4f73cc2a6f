package pgconformance

import (
	"context"
	"fmt"
	"time"
)

// CrashRestart implements conformance.CrashRestarter with
// pgtemp.RestartImmediate on Config.Cluster.
func (h *harness) CrashRestart(ctx context.Context) (string, time.Duration, error) {
	if h.cfg.Cluster == nil {
		return "", 0, fmt.Errorf("%s: crash restart: Config.Cluster is not set", pkg)
	}
	down, err := h.cfg.Cluster.RestartImmediate(ctx)
	if err != nil {
		return "", 0, err
	}
	return "SIGQUIT to the postmaster (immediate shutdown, no checkpoint), restart on the same data directory, recovery from WAL", down, nil
}
