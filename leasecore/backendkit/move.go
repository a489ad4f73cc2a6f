package backendkit

import (
	"context"
	"fmt"

	"github.com/leasefence/leasefence/leasecore"
)

// CheckSeal validates the arguments of sealing scope at its old location
// for the destination to: both identifiers by CheckName's rules, and a
// live context.
func CheckSeal(ctx context.Context, op, scope, to string) error {
	if err := CheckName(op, "scope", scope); err != nil {
		return err
	}
	if err := CheckName(op, "to", to); err != nil {
		return err
	}
	return CheckContext(op, ctx)
}

// CheckScopeSeal validates a leasecore.ScopeSeal given to an install: Scope
// and To by CheckName's rules; Floor 0 (nothing to carry) or a token
// (1..MaxToken: leasecore.SealedFloor itself is what a sealed location's
// floor reads, never the floor a seal carries); Space by CheckSpace, and
// empty when Floor is 0 (no token raised it); and a live context.
func CheckScopeSeal(ctx context.Context, op string, s leasecore.ScopeSeal) error {
	if err := CheckName(op, "scope", s.Scope); err != nil {
		return err
	}
	if err := CheckName(op, "to", s.To); err != nil {
		return err
	}
	switch {
	case s.Floor == leasecore.SealedFloor:
		return &leasecore.ArgError{Op: op, Field: "floor", Value: s.Floor.String(),
			Reason: "is the sealed floor, which a sealed location reads; install the ScopeSeal its seal returned, which carries the floor before the seal"}
	case s.Floor > MaxToken:
		return &leasecore.ArgError{Op: op, Field: "floor", Value: s.Floor.String(),
			Reason: fmt.Sprintf("is above the largest token %d", MaxToken)}
	case s.Floor == 0 && s.Space != "":
		return &leasecore.ArgError{Op: op, Field: "space", Value: Quote(s.Space),
			Reason: "must be empty when the floor is 0: no token raised it"}
	}
	if err := CheckSpace(op, s.Space); err != nil {
		return err
	}
	return CheckContext(op, ctx)
}
