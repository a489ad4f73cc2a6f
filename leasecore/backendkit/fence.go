package backendkit

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// ClaimOf returns the claim a Write makes: what a FencedResource's Write
// checks against the scope's floor.
func ClaimOf(w leasecore.Write) leasecore.Claim {
	return leasecore.Claim{Scope: w.Scope, Writer: w.Writer, Token: w.Token, Space: w.Space}
}

// CheckClaim validates a claim: scope and writer as names, a non-zero
// token, a valid space (CheckSpace), and a live context.
func CheckClaim(ctx context.Context, op string, c leasecore.Claim) error {
	if err := CheckName(op, "scope", c.Scope); err != nil {
		return err
	}
	if err := CheckName(op, "writer", c.Writer); err != nil {
		return err
	}
	if err := CheckToken(op, c.Token); err != nil {
		return err
	}
	if err := CheckSpace(op, c.Space); err != nil {
		return err
	}
	return CheckContext(op, ctx)
}

// TokenSpaceMismatch is the diagnosis a fence makes after it rejected c:
// given the scope's floor and the token space stored with it, it returns a
// *leasecore.TokenSpaceError when both spaces are known and differ and the
// floor is above c.Token, else nil (an ordinary rejection, or nothing to
// say). Backends call it on the rejection path only.
func TokenSpaceMismatch(op string, c leasecore.Claim, floor leasecore.Token, floorSpace string) error {
	if c.Space == "" || floorSpace == "" || c.Space == floorSpace || floor <= c.Token {
		return nil
	}
	return &leasecore.TokenSpaceError{Op: op, Scope: c.Scope, Token: c.Token, Space: c.Space, Floor: floor, FloorSpace: floorSpace}
}

// CheckAttemptLog validates an attempt log mode.
func CheckAttemptLog(op string, m leasecore.AttemptLog) error {
	switch m {
	case leasecore.LogRejected, leasecore.LogAll, leasecore.LogNone:
		return nil
	}
	return &leasecore.ArgError{Op: op, Field: "attempt log", Value: m.String(),
		Reason: "must be LogRejected, LogAll or LogNone"}
}

// MaxAttemptsRead is the largest Limit of one leasecore.AttemptQuery.
const MaxAttemptsRead = 10000

// CheckAttemptQuery validates an attempt-log read: a valid scope name, a
// Limit of 1 to MaxAttemptsRead, and a live context.
func CheckAttemptQuery(ctx context.Context, op string, q leasecore.AttemptQuery) error {
	if err := CheckName(op, "scope", q.Scope); err != nil {
		return err
	}
	if q.Limit < 1 || q.Limit > MaxAttemptsRead {
		return &leasecore.ArgError{Op: op, Field: "limit", Value: fmt.Sprint(q.Limit),
			Reason: fmt.Sprintf("must be 1 to %d", MaxAttemptsRead)}
	}
	return CheckContext(op, ctx)
}

// CheckPrune validates a prune of scope's attempt log: a valid scope name
// and a set bound that is not in the future (pruning entries not yet
// written would be a unit mistake), and a live context.
func CheckPrune(ctx context.Context, op, scope string, before time.Time) error {
	if err := CheckName(op, "scope", scope); err != nil {
		return err
	}
	if before.IsZero() {
		return &leasecore.ArgError{Op: op, Field: "before", Reason: "must be set"}
	}
	if before.After(time.Now()) {
		return &leasecore.ArgError{Op: op, Field: "before", Value: before.Format(time.RFC3339Nano),
			Reason: "is in the future"}
	}
	return CheckContext(op, ctx)
}

// ResourceReader is an optional interface that may be implemented by a
// leasecore.FencedResource. It reads what the resource holds, without
// changing it; the conformance suite requires it.
type ResourceReader interface {
	// Floor returns the largest token accepted for scope, or 0 when the
	// scope never accepted a write.
	Floor(ctx context.Context, scope string) (leasecore.Token, error)
	// ReadPart returns the current content of a part; ok is false when
	// the part was never written.
	ReadPart(ctx context.Context, scope, part string) (p leasecore.StoredPart, ok bool, err error)
	// Attempts returns the write log of scope, oldest first.
	Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error)
}
