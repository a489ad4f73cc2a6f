package leasecore

import (
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

// Claim returns the claim to write in scope under g: its token and token
// space, with g's holder as the writer.
func (g Grant) Claim(scope string) Claim {
	return Claim{Scope: scope, Writer: g.Holder, Token: g.Token, Space: g.Space}
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

// AttemptQuery selects entries of a scope's attempt log: those at or after
// Since (the zero time: from the beginning), oldest first, at most Limit.
type AttemptQuery struct {
	Scope string
	Since time.Time
	Limit int // 1 to 10000 (backendkit.MaxAttemptsRead)
}
