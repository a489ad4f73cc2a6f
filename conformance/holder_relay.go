package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/leasefence/leasefence/leasecore"
)

// relay is the holder protocol's RELAY <url>: one pass of the resource's
// outbox relay (OutboxRelay, the resource of KindOutbox), delivering each
// entry to the downstream stand-in at url, then RELAYED delivered=N. F9b
// kills the process while the downstream holds one of its requests.
func (h *holderProcess) relay(ctx context.Context, rest string) error {
	url := strings.TrimSpace(rest)
	if url == "" {
		return errors.New("want: RELAY <url>")
	}
	r, ok := h.res.(OutboxRelay)
	if !ok {
		return fmt.Errorf("the resource %T has no outbox relay (conformance.OutboxRelay): start the holder with KindOutbox", h.res)
	}
	client := newDeliveryClient()
	defer client.CloseIdleConnections()
	n, err := r.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
		return postEntry(ctx, client, url, e)
	})
	if err != nil {
		return err
	}
	h.say("RELAYED delivered=%d", n)
	return nil
}
