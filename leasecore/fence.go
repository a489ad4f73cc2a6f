package leasecore

import (
	"context"
	"fmt"
	"time"
)

// Claim is what a fence checks: a writer's claim to write in Scope under
// Token. Backends offer a fence over the scope's floor that the caller uses
// inside its own atomic operation (a PostgreSQL transaction, an etcd Txn),
// so the data it protects is the caller's own rows or keys; the part store
// (FencedResource) is one user of that fence.
type Claim struct {
	Scope  string // what one lease protects, e.g. "daily-report"
	Writer string // the holder, for the attempt log
	Token  Token

	// Space is the token space of Token (Grant.Space), optional. A fence
	// stores it with the floor when the claim raises the floor, and when
	// it rejects a claim whose space and the floor's are both known and
	// differ, it reports a *TokenSpaceError (ErrTokenSpace) instead of a
	// plain stale rejection: a scope fenced by two lease services. Empty:
	// rejections are never diagnosed this way. Build claims with
	// Grant.Claim or Session.Claim to carry it.
	Space string
}

// ClaimOf returns the claim a Write makes.
func ClaimOf(w Write) Claim {
	return Claim{Scope: w.Scope, Writer: w.Writer, Token: w.Token, Space: w.Space}
}

// Claim returns the claim to write in scope under g: its token and token
// space, with g's holder as the writer.
func (g Grant) Claim(scope string) Claim {
	return Claim{Scope: scope, Writer: g.Holder, Token: g.Token, Space: g.Space}
}

// CheckClaim validates a claim: scope and writer as names, a non-zero
// token, a valid space (CheckSpace), and a live context.
func CheckClaim(ctx context.Context, op string, c Claim) error {
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

// AttemptLog says which fence checks a backend records in its attempt log.
// The zero value is LogRejected.
type AttemptLog int

const (
	// LogRejected records rejected checks only: an accepted write's own
	// data already says who wrote it under which token. The default.
	LogRejected AttemptLog = iota
	// LogAll records every check, accepted or rejected; an accepted check's
	// entry commits with the caller's transaction (and is gone with it when
	// the caller rolls back). The lab and the conformance suite use it to
	// print the evidence the lease-fencing article (SOURCES.md) asks for.
	LogAll
	// LogNone records nothing.
	LogNone
)

// String names the mode as the options and the documentation do.
func (m AttemptLog) String() string {
	switch m {
	case LogRejected:
		return "rejected"
	case LogAll:
		return "all"
	case LogNone:
		return "none"
	}
	return fmt.Sprintf("AttemptLog(%d)", int(m))
}

// CheckAttemptLog validates an attempt log mode.
func CheckAttemptLog(op string, m AttemptLog) error {
	switch m {
	case LogRejected, LogAll, LogNone:
		return nil
	}
	return &ArgError{Op: op, Field: "attempt log", Value: m.String(),
		Reason: "must be LogRejected, LogAll or LogNone"}
}

// MaxAttemptsRead is the largest Limit of one AttemptQuery.
const MaxAttemptsRead = 10000

// AttemptQuery selects entries of a scope's attempt log: those at or after
// Since (the zero time: from the beginning), oldest first, at most Limit.
type AttemptQuery struct {
	Scope string
	Since time.Time
	Limit int // 1 to MaxAttemptsRead
}

// CheckAttemptQuery validates an attempt-log read.
func CheckAttemptQuery(ctx context.Context, op string, q AttemptQuery) error {
	if err := CheckName(op, "scope", q.Scope); err != nil {
		return err
	}
	if q.Limit < 1 || q.Limit > MaxAttemptsRead {
		return &ArgError{Op: op, Field: "limit", Value: fmt.Sprint(q.Limit),
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
		return &ArgError{Op: op, Field: "before", Reason: "must be set"}
	}
	if before.After(time.Now()) {
		return &ArgError{Op: op, Field: "before", Value: before.Format(time.RFC3339Nano),
			Reason: "is in the future"}
	}
	return CheckContext(op, ctx)
}
