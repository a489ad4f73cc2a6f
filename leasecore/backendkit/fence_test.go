package backendkit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// wantArg checks that err is an ArgError naming field, or nil when field
// is empty.
func wantArg(t *testing.T, what string, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Errorf("%s: %v, want nil", what, err)
		}
		return
	}
	var ae *leasecore.ArgError
	if !errors.As(err, &ae) || ae.Field != field || !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("%s: %v, want an ArgError naming %q", what, err, field)
	}
}

func TestCheckClaim(t *testing.T) {
	ctx := context.Background()
	good := leasecore.Claim{Scope: "s", Writer: "w", Token: 1}
	wantArg(t, "good", backendkit.CheckClaim(ctx, "check", good), "")
	wantArg(t, "empty scope", backendkit.CheckClaim(ctx, "check", leasecore.Claim{Writer: "w", Token: 1}), "scope")
	wantArg(t, "NUL writer", backendkit.CheckClaim(ctx, "check", leasecore.Claim{Scope: "s", Writer: "a\x00", Token: 1}), "writer")
	wantArg(t, "token 0", backendkit.CheckClaim(ctx, "check", leasecore.Claim{Scope: "s", Writer: "w"}), "token")
	wantArg(t, "token above MaxToken", backendkit.CheckClaim(ctx, "check",
		leasecore.Claim{Scope: "s", Writer: "w", Token: backendkit.MaxToken + 1}), "token")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := backendkit.CheckClaim(cancelled, "check", good); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	w := leasecore.Write{Scope: "s", Part: "p", Content: "c", Writer: "w", Token: 3}
	if got := backendkit.ClaimOf(w); got != (leasecore.Claim{Scope: "s", Writer: "w", Token: 3}) {
		t.Errorf("ClaimOf = %+v", got)
	}
}

func TestCheckAttemptLog(t *testing.T) {
	for _, m := range []leasecore.AttemptLog{leasecore.LogRejected, leasecore.LogAll, leasecore.LogNone} {
		wantArg(t, m.String(), backendkit.CheckAttemptLog("new fence", m), "")
	}
	wantArg(t, "mode 7", backendkit.CheckAttemptLog("new fence", leasecore.AttemptLog(7)), "attempt log")
	if leasecore.AttemptLog(0) != leasecore.LogRejected {
		t.Error("the zero AttemptLog is not LogRejected")
	}
	if s := leasecore.AttemptLog(7).String(); !strings.Contains(s, "7") {
		t.Errorf("String of an unknown mode = %q", s)
	}
}

func TestCheckAttemptQuery(t *testing.T) {
	ctx := context.Background()
	wantArg(t, "good", backendkit.CheckAttemptQuery(ctx, "attempts", leasecore.AttemptQuery{Scope: "s", Limit: 1}), "")
	wantArg(t, "max limit", backendkit.CheckAttemptQuery(ctx, "attempts",
		leasecore.AttemptQuery{Scope: "s", Limit: backendkit.MaxAttemptsRead}), "")
	wantArg(t, "limit 0", backendkit.CheckAttemptQuery(ctx, "attempts", leasecore.AttemptQuery{Scope: "s"}), "limit")
	wantArg(t, "limit too big", backendkit.CheckAttemptQuery(ctx, "attempts",
		leasecore.AttemptQuery{Scope: "s", Limit: backendkit.MaxAttemptsRead + 1}), "limit")
	wantArg(t, "empty scope", backendkit.CheckAttemptQuery(ctx, "attempts", leasecore.AttemptQuery{Limit: 1}), "scope")
}

func TestCheckPrune(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	wantArg(t, "good", backendkit.CheckPrune(ctx, "prune", "s", now.Add(-time.Hour)), "")
	wantArg(t, "zero time", backendkit.CheckPrune(ctx, "prune", "s", time.Time{}), "before")
	wantArg(t, "future", backendkit.CheckPrune(ctx, "prune", "s", now.Add(time.Hour)), "before")
	wantArg(t, "empty scope", backendkit.CheckPrune(ctx, "prune", "", now), "scope")
}
