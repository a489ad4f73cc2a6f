package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// contenders is the number of concurrent clients in F3, each with its own
// connection.
const contenders = 16

// caseF3 races contenders clients behind a barrier, three rounds: a fresh
// lease (exactly one winner), a held lease (none), an expired lease (exactly
// one). Acquire is one atomic statement, so the race has one winner.
func caseF3(ctx context.Context, c *caseRun, h Harness) {
	clients := make([]leasecore.Lease, contenders)
	var insp leasecore.LeaseInspector
	for i := range clients {
		clients[i], insp = c.openLease(h)
		// Connect before the barrier, so the race is between requests,
		// not between connection set-ups.
		_, err := insp.Inspect(ctx, leaseName)
		c.Must(err, fmt.Sprintf("client %d connects", i))
	}
	ttl := c.ttl(1500 * time.Millisecond)
	c.Notef("%d clients, each with its own connection; ttl %v", contenders, ttl)

	// answered counts the attempts the clients report an answer for: a
	// grant or ErrHeld. Any other outcome (a dropped connection, a client
	// that never returned) is an attempt the race did not decide.
	answered := 0
	// round releases the contenders together and checks the outcome
	// against the round's design: winners win, every other contender is
	// told the lease is held.
	round := func(label string, winners int) []leasecore.Grant {
		results := make([]error, contenders)
		grants := make([]leasecore.Grant, contenders)
		var ready, done sync.WaitGroup
		barrier := make(chan struct{})
		for i := range contenders {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-barrier
				grants[i], results[i] = clients[i].Acquire(ctx, leaseName, fmt.Sprintf("holder-%02d", i), ttl)
			}()
		}
		ready.Wait()
		close(barrier) // every contender is parked: release them together
		done.Wait()

		var won []leasecore.Grant
		held := 0
		var other error
		for i, err := range results {
			switch {
			case err == nil:
				won = append(won, grants[i])
			case errors.Is(err, leasecore.ErrHeld):
				held++
			default:
				other = errors.Join(other, err)
			}
		}
		answered += len(won) + held
		actual := fmt.Sprintf("%d ErrHeld", held)
		if other != nil {
			actual += fmt.Sprintf(", other errors: %v", other)
		}
		who, what := "every contender but the winner", "exactly one winner"
		if winners == 0 {
			who, what = "every contender", "no winner"
		}
		c.Equal("I1", label+": "+who+" is told the lease is held", fmt.Sprintf("%d ErrHeld", contenders-winners), actual)
		c.Equal("I1", label+": "+what, winners, len(won))
		return won
	}

	sent := time.Now() // before any of round 1's acquires is sent
	w1 := round("round 1, fresh lease", 1)
	round("round 2, lease held", 0)
	if len(w1) != 1 {
		c.Fatalf("cannot go on without exactly one round-1 winner")
	}
	round2 := time.Now()
	freeAt := c.waitFree(insp, leaseName, ttl, sent, "round 1's winner's hold, never renewed,", "round 1")
	c.Notef("the lease expired by the backend's clock %v after round 2", freeAt.Sub(round2).Round(time.Millisecond))
	w3 := round("round 3, lease expired", 1)
	c.Equal("F3", "attempts in all, each answered with a grant or ErrHeld", 3*contenders, answered)
	if len(w3) != 1 {
		return
	}
	c.NextToken("round 3's winner holds the next token", w1[0].Token, w3[0].Token)
	st, err := insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect the final lease")
	c.Equal("I2", "the lease's final token is round 3's", fmt.Sprintf("token=%d holder=%s", w3[0].Token, w3[0].Holder),
		fmt.Sprintf("token=%d holder=%s", st.Token, st.Holder))
}
