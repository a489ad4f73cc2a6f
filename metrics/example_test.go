package leasefencemetrics_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
	leasefencemetrics "github.com/leasefence/leasefence/metrics"
)

// The collectors on a registry of your own, fed by a session's observer
// and a fence's. The in-memory resource stands in for a backend's fence
// here: fencepg.WithFenceObserver(m.ObserveFence) or
// fenceetcd.WithFenceObserver(m.ObserveFence) report its writes for you.
func ExampleNew() {
	reg := prometheus.NewRegistry()
	m, err := leasefencemetrics.New(reg)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	leases := memfence.NewLeases(nil)
	sess, err := leasecore.NewSession(ctx, leases, "nightly-invoices", "host-a",
		leasecore.WithSessionObserver(m.ObserveSession))
	if err != nil {
		panic(err)
	}
	defer sess.Close(ctx)

	res := memfence.NewResource()
	for _, token := range []leasecore.Token{sess.Token() + 1, sess.Token()} { // a newer holder, then us: stale
		w := leasecore.Write{Scope: "invoices", Part: "run", Content: "…", Writer: "host", Token: token}
		r, err := res.Write(ctx, w)
		if err != nil {
			panic(err)
		}
		m.ObserveFence(leasecore.FenceEvent{Op: "write", Claim: backendkit.ClaimOf(w), Result: r})
	}

	// What a scrape of reg would show (promhttp.HandlerFor(reg, ...)), in
	// short.
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range families {
		if mf.GetName() != "leasefence_acquires_total" && mf.GetName() != "leasefence_fenced_writes_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			var labels []string
			for _, l := range mt.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			fmt.Printf("%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), mt.GetCounter().GetValue())
		}
	}
	// Output:
	// leasefence_acquires_total{name="nightly-invoices",outcome="acquired"} 1
	// leasefence_fenced_writes_total{outcome="accepted",scope="invoices"} 1
	// leasefence_fenced_writes_total{outcome="rejected",scope="invoices"} 1
}
