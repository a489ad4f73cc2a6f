package tests

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
	leasefencemetrics "github.com/leasefence/leasefence/metrics"
)

// observed is docs/operating.md's wiring of the collectors and the logs;
// gomodtest's TestDocsGoBlocks keeps the page's block equal to its body.
func observed(ctx context.Context, appPool *pgxpool.Pool, leases leasecore.Lease, instance string) error {
	reg := prometheus.NewRegistry() // your registry; prometheus.DefaultRegisterer only if you mean it
	m, err := leasefencemetrics.New(reg)
	if err != nil {
		return err
	}
	logger := slog.Default()

	fence, err := fencepg.NewFence(appPool,
		fencepg.WithFenceObserver(m.ObserveFence), // fenced writes by scope and outcome
		fencepg.WithLogger(logger))                // WARN "stale write rejected" (fenceetcd: the same two options)
	if err != nil {
		return err
	}
	sess, err := leasecore.NewSession(ctx, leases, "nightly-invoices", instance,
		leasecore.WithTTL(15*time.Second),
		leasecore.WithSessionObserver(m.ObserveSession), // acquires, renewals, losses, time left
		leasecore.WithLogger(logger))                    // acquired, renewed late, lost with reason
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	// A campaign: leasecore.WithCampaignObserver(m.ObserveCampaign) (handoffs), and
	// leasecore.WithSessionOptions(leasecore.WithSessionObserver(m.ObserveSession), leasecore.WithLogger(logger)).
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	_, err = fence.Advance(ctx, sess.Claim("invoices"))
	return err
}
