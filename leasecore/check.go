package leasecore

import (
	"context"
	"time"

	"github.com/leasefence/leasefence/leasecore/internal/validate"
)

// leasecore checks its own arguments by the rules backendkit exports to
// backends (backendkit imports leasecore, so both take them from
// internal/validate).

// argErr wraps a rule's problem in the *ArgError of op; no problem is a nil
// error.
func argErr(op string, p *validate.Problem) error {
	if p == nil {
		return nil
	}
	return &ArgError{Op: op, Field: p.Field, Value: p.Value, Reason: p.Reason}
}

func checkName(op, field, v string) error { return argErr(op, validate.Name(field, v)) }

func checkTTL(op string, ttl, minTTL time.Duration) error {
	return argErr(op, validate.TTL(ttl, minTTL))
}

// checkAcquireAll is backendkit.CheckAcquireAll.
func checkAcquireAll(ctx context.Context, names []string, holder string, ttl, minTTL time.Duration) error {
	const op = "acquire all"
	if err := argErr(op, validate.AcquireAll(names, holder, ttl, minTTL)); err != nil {
		return err
	}
	return validate.Context(op, ctx)
}

// checkInspect is backendkit.CheckInspect.
func checkInspect(ctx context.Context, name string) error {
	if err := checkName("inspect", "name", name); err != nil {
		return err
	}
	return validate.Context("inspect", ctx)
}
