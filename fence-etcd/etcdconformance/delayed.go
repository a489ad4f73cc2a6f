package etcdconformance

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/leasecore"
)

var _ conformance.DelayedNetwork = (*harness)(nil)

// ResourceAddress implements conformance.DelayedNetwork: the host:port of
// the first of Config.Endpoints (a URL such as etcdtemp's
// "http://127.0.0.1:2379", or a bare host:port as clientv3 also accepts
// them). With several endpoints the proxy stands in front of that one
// member; a follower forwards the writes it receives to the leader. Empty
// when the endpoint has no TCP address (unix://), which the case reports.
func (h *harness) ResourceAddress() string {
	_, hostPort := endpointAddress(h.cfg.Endpoints)
	return hostPort
}

// endpointAddress splits the first endpoint into its scheme ("http" when it
// has none) and host:port; host:port is empty when there is none.
func endpointAddress(endpoints []string) (scheme, hostPort string) {
	if len(endpoints) == 0 {
		return "", ""
	}
	ep := endpoints[0]
	if !strings.Contains(ep, "://") {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return "", ""
		}
		return "http", ep
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		return "", ""
	}
	return u.Scheme, u.Host
}

// ResourcesVia implements conformance.DelayedNetwork: one etcd client whose
// only endpoint is addr, and on it the fenced part store and the unfenced
// control that OpenResource and UnfencedResource build, under the
// harness's prefix. The client has one gRPC connection, so one TCP
// connection through the proxy; Dial's request (a count under an unused
// prefix) has set it up, HTTP/2 preface and settings included, before this
// returns. Nothing on that connection runs out while the proxy holds what
// the client sends for a few seconds: the client sends no keepalive pings
// (clientv3.Config.DialKeepAliveTime is zero, so no grpc keepalive
// parameters are set), and the server pings an idle client only after
// --grpc-keepalive-interval (2h by default) and waits --grpc-keepalive-timeout
// (20s) for the answer; the held write itself waits with the case's
// context, which has no deadline of a few seconds.
func (h *harness) ResourcesVia(ctx context.Context, addr string) (fenced, unfenced conformance.Resource, err error) {
	scheme, _ := endpointAddress(h.cfg.Endpoints)
	if scheme == "" {
		return nil, nil, fmt.Errorf("%s: the first endpoint of %q has no TCP address to put a proxy in front of", pkg, h.cfg.Endpoints)
	}
	cli, err := dial(ctx, []string{scheme + "://" + addr})
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = closeClient(cli)
		return nil, nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	h.clients = append(h.clients, cli)
	h.mu.Unlock()
	res, err := fenceetcd.NewResource(cli, fenceetcd.WithPrefix(h.prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
	if err != nil {
		return nil, nil, err
	}
	controls, err := etcdcontrol.New(cli, fenceetcd.WithPrefix(h.prefix))
	if err != nil {
		return nil, nil, err
	}
	return res, controls.Unfenced(), nil
}
