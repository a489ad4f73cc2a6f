package pgconformance

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/conformance"
)

var _ conformance.DelayedNetwork = (*harness)(nil)

// ResourceAddress implements conformance.DelayedNetwork: the host:port of
// Config.ResourceDSN — PostgreSQL's, or the pooler's when the DSN goes
// through one (Config.Pooler): the proxy then sits between the client and
// the pooler, where the client's own bytes travel. Empty when the DSN does
// not name a TCP host (a Unix socket directory), which the case reports.
func (h *harness) ResourceAddress() string {
	cfg, err := pgconn.ParseConfig(h.cfg.ResourceDSN)
	if err != nil || cfg.Host == "" || strings.HasPrefix(cfg.Host, "/") {
		return ""
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// ResourcesVia implements conformance.DelayedNetwork: the fenced part store
// and the unfenced control, each on a pool of exactly one connection to
// addr, with the configured driver and every other setting of
// Config.ResourceDSN. One connection, so that a write held on it cannot
// move to another one: the pool has no other to take, and neither driver
// opens a second while the first is busy (pgxpool waits for it,
// database/sql waits under SetMaxOpenConns(1)). pgopen.Open pings, so the
// connection, its startup and authentication are done before this returns.
func (h *harness) ResourcesVia(ctx context.Context, addr string) (fenced, unfenced conformance.Resource, err error) {
	if h.ResourceAddress() == "" {
		return nil, nil, fmt.Errorf("%s: the resource DSN names no TCP host:port to put a proxy in front of", pkg)
	}
	dsn, err := withHostPort(h.cfg.ResourceDSN, addr)
	if err != nil {
		return nil, nil, err
	}
	fp, err := h.open(ctx, dsn, 1)
	if err != nil {
		return nil, nil, err
	}
	res, err := fp.Resource(h.cfg.logOption())
	if err != nil {
		return nil, nil, err
	}
	up, err := h.open(ctx, dsn, 1)
	if err != nil {
		return nil, nil, err
	}
	controls, err := up.Controls()
	if err != nil {
		return nil, nil, err
	}
	return res, controls.Unfenced(), nil
}
