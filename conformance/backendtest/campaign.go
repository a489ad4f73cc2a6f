package backendtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// CampaignHandoff runs leasecore.Campaign for holder "a" on leasesA and,
// once a leads, for "b" on leasesB (another client of the same lease
// service), with TTL ttl and poll interval poll. a's function returns after
// b was refused and has waited a while; b must then lead with a larger
// token. With woken, the lease clients are backendkit.Waiters that can wait:
// b must lead within ttl/4 of a's return (a poll pauses at least poll/2,
// so pass a poll far above that) and its campaign must not have retried
// after an error. It returns the hand-off time.
func CampaignHandoff(tb testing.TB, leasesA, leasesB leasecore.Lease, name string, ttl, poll time.Duration, woken bool) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := func(observe func(leasecore.CampaignEvent)) []leasecore.CampaignOption {
		return []leasecore.CampaignOption{
			leasecore.WithSessionOptions(leasecore.WithTTL(ttl)),
			leasecore.WithPollInterval(poll),
			leasecore.WithCampaignObserver(observe),
		}
	}

	elected, resign := make(chan leasecore.Token, 1), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		err := leasecore.Campaign(ctx, leasesA, name, "a", func(ctx context.Context, g leasecore.Grant) error {
			elected <- g.Token
			<-resign
			return nil
		}, opts(func(leasecore.CampaignEvent) {})...)
		if err != nil {
			tb.Errorf("campaign a = %v, want nil (its function returned nil)", err)
		}
	})
	tokA := <-elected

	var (
		mu      sync.Mutex
		retries []error
	)
	observed := make(chan struct{}, 1)
	type leadership struct {
		token leasecore.Token
		at    time.Time
	}
	bLeads := make(chan leadership, 1)
	wg.Go(func() {
		err := leasecore.Campaign(ctx, leasesB, name, "b", func(ctx context.Context, g leasecore.Grant) error {
			bLeads <- leadership{g.Token, time.Now()}
			return nil
		}, opts(func(ev leasecore.CampaignEvent) {
			switch ev.Kind {
			case leasecore.CampaignObserved:
				select {
				case observed <- struct{}{}:
				default:
				}
			case leasecore.CampaignRetry:
				mu.Lock()
				retries = append(retries, ev.Err)
				mu.Unlock()
			}
		})...)
		if err != nil {
			tb.Errorf("campaign b = %v, want nil", err)
		}
	})
	<-observed                         // b was refused and saw a as the holder
	time.Sleep(300 * time.Millisecond) // and now waits
	resigned := time.Now()
	close(resign)
	b := <-bLeads
	wg.Wait()

	if b.token <= tokA {
		tb.Fatalf("b led with token %d, want one larger than a's %d", b.token, tokA)
	}
	handoff := b.at.Sub(resigned)
	tb.Logf("b elected %v after a's function returned (token %d -> %d)", handoff.Round(time.Millisecond), tokA, b.token)
	if woken {
		if handoff > ttl/4 {
			tb.Fatalf("b became leader %v after a resigned (TTL %v, poll interval %v): not woken by the release", handoff, ttl, poll)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(retries) != 0 {
			tb.Fatalf("campaign b retried after errors %v, want none: WaitFree should wait", retries)
		}
	}
	return handoff
}
