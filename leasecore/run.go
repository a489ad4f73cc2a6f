package leasecore

import (
	"context"
	"errors"
	"fmt"
)

// Run runs job while holder holds lease name: work that only one instance
// may do at a time (a nightly report, a migration). It acquires a Session
// (NewSession with opts), calls job with a context and the session's grant,
// keeps the lease renewed while job runs, and when job returns closes the
// session: renewal stops and the lease is released, so another instance can
// acquire it at once.
//
// Run does not wait for the lease. When another holder has it, Run returns
// NewSession's error, which wraps ErrHeld, and does not call job: the
// normal outcome for every instance but one. Any other acquire error is
// returned as it is. Bad input (a nil lease or job, an invalid name or
// holder, bad options) is refused before anything is sent, with an
// *ArgError naming the field and wrapping ErrInvalidArgument.
//
// The context job gets is derived from ctx (its values and its end) and is
// also cancelled when the session ends, at its local deadline (even while a
// renewal hangs) or when a renewal finds the hold lost; context.Cause then
// returns the session's Err, wrapping ErrLocalDeadline or ErrLost. That
// context is a hint to stop early and waste less work, not what makes job's
// writes safe: a pause can fall between any check of it and the write.
// What makes them safe is the fence: every write job makes must carry the
// grant's token, as g.Claim(scope) does (token space included), and the
// resource's check of that token rejects the write of a holder whose lease
// has passed to another. g is the grant as acquired: its Name, Holder,
// Token, TTL and Space hold for the whole session; its Start is the
// acquire's (renewals do not move it).
//
// Run returns job's result, refined in one case: when the session had
// ended by the time job returned an error (a renewal found the hold lost,
// or the local deadline had passed by the session's clock, also when its
// timer had not fired yet, as in a process just woken from a pause), the
// error Run returns also wraps the session's Err, so errors.Is(err, ErrLost) or errors.Is(err,
// ErrLocalDeadline) says why (an error from job that already wraps it, such
// as context.Cause(ctx), is returned as it is). When job returns nil, Run
// returns nil even if the session ended meanwhile: job reports its work
// done, and each write it made was judged by the fence on its token; the
// session's end undoes no write the fence accepted. A job that wants the
// end reported returns context.Cause(ctx) when its context has ended.
//
// The release's own outcome is never returned; Run reports the job's. A
// release that fails (the backend cannot be reached) leaves the lease held
// until its TTL runs out, which delays the next instance but is never
// unsafe, as the token is never issued again; the failure is the Err of
// the session's SessionEnded event (WithSessionObserver, WithLogger). The
// release does not inherit ctx's end (ctx ending may be why job returned)
// and is bounded by one TTL on the session's clock, so a dead backend holds
// Run up for at most one TTL after job returned.
//
// If job panics, Run closes the session, releasing the lease, before the
// panic goes on. Run starts no goroutine that outlives it, provided the
// Lease's requests return once their context ends.
func Run(ctx context.Context, lease Lease, name, holder string,
	job func(ctx context.Context, g Grant) error, opts ...SessionOption) error {
	const op = "run"
	cfg, err := newSessionConfig(op, lease, opts)
	if err != nil {
		return err
	}
	if err := checkName(op, "name", name); err != nil {
		return err
	}
	if err := checkName(op, "holder", holder); err != nil {
		return err
	}
	if job == nil {
		return &ArgError{Op: op, Field: "job", Reason: "must not be nil"}
	}
	sess, err := NewSession(ctx, lease, name, holder, opts...)
	if err != nil {
		return err
	}
	return runJob(ctx, sess, cfg, job)
}

// errRunReleaseTimeout is the cause of Run's release context when its time
// is up.
var errRunReleaseTimeout = fmt.Errorf("leasecore: run: release took longer than the ttl: %w", ErrUnavailable)

func runJob(ctx context.Context, sess *Session, cfg sessionConfig, job func(context.Context, Grant) error) error {
	// The release does not inherit ctx's end, which may be why job
	// returned. It is bounded by the TTL: waiting longer gains nothing, as
	// the backend frees the lease on its own once the TTL has run out, and
	// a shorter bound (the renew timeout) could give up on a slow but
	// working backend that would still free the lease for the next
	// instance sooner than the TTL. The bound also covers Close's wait for
	// a renewal in flight, which is cancelled at once.
	closeSession := func() {
		rctx, cancel := withClockTimeout(context.WithoutCancel(ctx), cfg.clock, cfg.ttl, errRunReleaseTimeout)
		defer cancel()
		_ = sess.Close(rctx) // reported to the session's observers; see Run
	}
	closed := false
	defer func() {
		if !closed {
			// job panicked: release before the panic goes on, so a caller
			// that recovers is not left holding a lease nobody works under.
			closeSession()
		}
	}()

	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fired := make(chan struct{})
	stop := context.AfterFunc(sess.Context(), func() {
		cancel(context.Cause(sess.Context()))
		close(fired)
	})
	defer stop()
	jobErr := job(jctx, sess.Grant())
	// A process just woken from a pause (SIGSTOP, a GC pause) can run job
	// to its end before the session's own timer goroutine runs: judge the
	// local deadline by the session's clock now, so the end is reported
	// whichever of the two runs first.
	sess.endIfPastDeadline()
	if !stop() {
		<-fired // the AfterFunc goroutine is done too
	}
	cancel(nil)
	ended := sess.Err() // nil: the session still ran when job returned
	closed = true
	closeSession()

	if jobErr == nil || ended == nil || errors.Is(jobErr, ended) {
		return jobErr
	}
	return fmt.Errorf("%w; the session had ended: %w", jobErr, ended)
}
