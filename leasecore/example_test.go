package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// The whole call sequence against the in-memory backend: a session per
// instance, every write carrying the session's token, a second instance
// turned away while the lease is held, and a stale write rejected by the
// resource after a newer holder wrote.
func Example() {
	ctx := context.Background()
	leases := memfence.NewLeases(nil) // the lease service
	reports := memfence.NewResource() // the protected resource
	opts := []leasecore.SessionOption{
		leasecore.WithTTL(15 * time.Second),
		leasecore.WithMargin(3 * time.Second),                // local deadline 12 s after the acquire was sent
		leasecore.WithRenewInterval(3750 * time.Millisecond), // renew at about TTL/4
	}

	a, err := leasecore.NewSession(ctx, leases, "report-job", "holder-a", opts...)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holder-a token:", a.Token())
	res, err := reports.Write(ctx, leasecore.Write{
		Scope: "daily-report", Part: "summary", Content: "report by a",
		Writer: "holder-a", Token: a.Token(),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("holder-a writes summary: accepted=%v floor=%d\n", res.Accepted, res.Floor)

	// Another instance finds the lease held: the normal outcome, not a failure.
	_, err = leasecore.NewSession(ctx, leases, "report-job", "holder-b", opts...)
	fmt.Println("holder-b while held:", errors.Is(err, leasecore.ErrHeld))

	// holder-a finishes; Close releases, so holder-b need not wait for the TTL.
	staleToken := a.Token()
	if err := a.Close(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("holder-a closed:", errors.Is(a.Err(), leasecore.ErrClosed))

	b, err := leasecore.NewSession(ctx, leases, "report-job", "holder-b", opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(ctx)
	fmt.Println("holder-b token:", b.Token())
	res, err = reports.Write(ctx, leasecore.Write{
		Scope: "daily-report", Part: "summary", Content: "report by b",
		Writer: "holder-b", Token: b.Token(),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("holder-b writes summary: accepted=%v floor=%d\n", res.Accepted, res.Floor)

	// A write with holder-a's old token, as a holder paused before its write
	// would send it, is a result, not an error: rejected, also for a part
	// holder-b never touched.
	res, err = reports.Write(ctx, leasecore.Write{
		Scope: "daily-report", Part: "detail", Content: "stale report by a",
		Writer: "holder-a", Token: staleToken,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stale holder-a writes detail: accepted=%v floor=%d\n", res.Accepted, res.Floor)

	p, _, _ := reports.ReadPart(ctx, "daily-report", "summary")
	fmt.Printf("summary: %q (token %d)\n", p.Content, p.Token)

	// Output:
	// holder-a token: 1
	// holder-a writes summary: accepted=true floor=1
	// holder-b while held: true
	// holder-a closed: true
	// holder-b token: 2
	// holder-b writes summary: accepted=true floor=2
	// stale holder-a writes detail: accepted=false floor=2
	// summary: "report by b" (token 2)
}

// A leader job run by two instances: each campaigns for the same lease and
// leads while elected, every write carrying its token; the lead function's
// context ends when the lease can no longer be trusted (loss or local
// deadline, context.Cause says which), and Campaign then campaigns again.
// host-2 waits while host-1 leads and takes over when host-1 steps down.
func ExampleCampaign() {
	leases := memfence.NewLeases(nil) // in production: a fence-pg or fence-etcd lease store
	ctx, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	leading := make(chan string)

	// The leader job: lead until ctx ends, or return when done (stepDown).
	job := func(host string, stepDown <-chan struct{}) error {
		return leasecore.Campaign(ctx, leases, "nightly-invoices", host,
			func(ctx context.Context, g leasecore.Grant) error {
				leading <- fmt.Sprintf("%s leads with token %d", host, g.Token) // write with g.Claim(scope) here
				select {
				case <-ctx.Done(): // lost, past the local deadline, or shut down
					return context.Cause(ctx)
				case <-stepDown:
					return nil // done: the lease is released, Campaign returns nil
				}
			},
			leasecore.WithSessionOptions(leasecore.WithTTL(15*time.Second)))
	}

	host1StepDown := make(chan struct{})
	host1, host2 := make(chan error, 1), make(chan error, 1)
	go func() { host1 <- job("host-1", host1StepDown) }()
	fmt.Println(<-leading)
	go func() { host2 <- job("host-2", nil) }() // waits while host-1 holds the lease
	close(host1StepDown)
	fmt.Println("host-1 campaign:", <-host1)
	fmt.Println(<-leading)
	shutdown()
	fmt.Println("host-2 campaign:", <-host2)

	// Output:
	// host-1 leads with token 1
	// host-1 campaign: <nil>
	// host-2 leads with token 2
	// host-2 campaign: context canceled
}

// A job that only one instance may run at a time: each instance calls Run,
// which acquires the lease, runs the job with the grant, and releases the
// lease when the job returns. An instance that finds the lease held gets
// ErrHeld and skips the job. Every write carries the grant's token: the
// resource's check of it, not the job's context, keeps a stale holder's
// write out.
func ExampleRun() {
	ctx := context.Background()
	leases := memfence.NewLeases(nil) // in production: a fence-pg or fence-etcd lease store
	reports := memfence.NewResource() // the protected resource
	opts := []leasecore.SessionOption{leasecore.WithTTL(15 * time.Second)}

	report := func(host string) func(context.Context, leasecore.Grant) error {
		// ctx ends when the lease is lost or past its local deadline: a
		// hint to stop early. g.Claim carries the token and its space.
		return func(ctx context.Context, g leasecore.Grant) error {
			c := g.Claim("daily-report")
			res, err := reports.Write(ctx, leasecore.Write{
				Scope: c.Scope, Part: "summary", Content: "report by " + host,
				Writer: c.Writer, Token: c.Token, Space: c.Space,
			})
			if err != nil {
				return err
			}
			if !res.Accepted {
				return fmt.Errorf("%s: a newer holder wrote (floor %d): this report is stale", host, res.Floor)
			}
			fmt.Printf("%s wrote the report with token %d\n", host, g.Token)
			return nil
		}
	}

	err := leasecore.Run(ctx, leases, "daily-report", "host-1", func(ctx context.Context, g leasecore.Grant) error {
		// While host-1 runs the job, host-2 is turned away.
		err := leasecore.Run(ctx, leases, "daily-report", "host-2", report("host-2"), opts...)
		fmt.Println("host-2 while host-1 runs:", errors.Is(err, leasecore.ErrHeld))
		return report("host-1")(ctx, g)
	}, opts...)
	fmt.Println("host-1 run:", err)

	// host-1's Run released the lease: the next run starts at once.
	err = leasecore.Run(ctx, leases, "daily-report", "host-2", report("host-2"), opts...)
	fmt.Println("host-2 run:", err)

	// Output:
	// host-2 while host-1 runs: true
	// host-1 wrote the report with token 1
	// host-1 run: <nil>
	// host-2 wrote the report with token 2
	// host-2 run: <nil>
}
