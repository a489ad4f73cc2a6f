package conformance_test

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
)

// The suite must be able to fail: these tests run it against broken
// backends and check that it says so, case by case.

// unfencedAsFenced is a harness whose "fenced" resource is the naive
// unfenced one.
type unfencedAsFenced struct{ *memHarness }

func (h unfencedAsFenced) OpenResource(ctx context.Context) (conformance.Resource, error) {
	return h.UnfencedResource(ctx)
}

// reusedTokens is a lease service that hands out token 1 on every acquire.
type reusedTokens struct{ leasecore.Lease }

func (l reusedTokens) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	g.Token = 1
	return g, err
}

func (l reusedTokens) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	return l.Lease.(leasecore.LeaseInspector).Inspect(ctx, name)
}

type reusedTokenHarness struct{ *memHarness }

func (h reusedTokenHarness) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	l, err := h.memHarness.OpenLease(ctx)
	return reusedTokens{l}, err
}

// undeclared lacks the negative controls without declaring them absent.
type undeclared struct {
	conformance.Harness // hides memHarness's optional methods
}

func report(t *testing.T, nh conformance.NewHarness, ids ...string) (conformance.Summary, string) {
	t.Helper()
	var out bytes.Buffer
	sum, err := conformance.Report(context.Background(), &out, nh, conformance.ReportOptions{Cases: ids})
	if err != nil {
		t.Fatalf("Report: %v", err)
	}
	return sum, out.String()
}

func TestSuiteFailsUnfencedResource(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return unfencedAsFenced{h.(*memHarness)}, nil
	}, "F1", "F7", "F9")
	for _, want := range []string{
		"FAIL [I3] holder-a's late write with token=1 is rejected",
		"FAIL [I3] the scope floor rejects A's detail",
		"FAIL [I3] order B->A: the fenced resource keeps the newest content",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0 for an unfenced resource")
	}
}

func TestSuiteFailsReusedTokens(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return reusedTokenHarness{h.(*memHarness)}, nil
	}, "F1", "F3")
	for _, want := range []string{
		"FAIL [I2] holder-b acquires right after the release, with a larger token (expected=token=2, actual=token=1)",
		"FAIL [I2] round 3's winner holds the next token",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0 for a lease that reuses tokens")
	}
}

func TestSuiteFailsUndeclaredAbility(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return undeclared{h}, nil
	}, "F7")
	if !strings.Contains(out, "FAIL the harness neither implements *conformance.NegativeControls (negative controls) nor declares it absent") {
		t.Errorf("an undeclared missing ability did not fail:\n%s", out)
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0")
	}
}

func TestReportFormat(t *testing.T) {
	sum, out := report(t, newMemHarness)
	if sum.Failed != 0 {
		t.Fatalf("failed=%d:\n%s", sum.Failed, out)
	}
	for _, id := range []string{"F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9"} {
		if !regexp.MustCompile(`(?m)^CASE ` + id + ` :: \S`).MatchString(out) {
			t.Errorf("no CASE %s header:\n%s", id, out)
		}
	}
	// Every line is a header, a check, a note, a skip, a section or the summary.
	line := regexp.MustCompile(`^(CASE F\d :: .+|  (ok  |FAIL|note|skip) .+|  -- .+|SUMMARY passed=\d+ failed=\d+)$`)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("line not in the article's format: %q", l)
		}
	}
	if last := lines[len(lines)-1]; last != "SUMMARY passed="+strconv.Itoa(sum.Passed)+" failed=0" {
		t.Errorf("last line %q", last)
	}
	if !strings.Contains(out, "  skip long transaction: an in-memory map has no transactions and one clock") {
		t.Errorf("a declared absence did not print its reason:\n%s", out)
	}
	if _, err := conformance.Report(context.Background(), &bytes.Buffer{}, newMemHarness,
		conformance.ReportOptions{Cases: []string{"F42"}}); err == nil {
		t.Errorf("an unknown case ID was accepted")
	}
}

// atomicOnly declares the commit gap absent, as etcd does.
type atomicOnly struct{ *memHarness }

func (h atomicOnly) Traits() conformance.Traits {
	t := h.memHarness.Traits()
	t.Absent[conformance.AbilityCommitGap] = "one atomic request, nothing to pause"
	t.Absent[conformance.AbilityLockWaitProbe] = "no lock to wait on"
	return t
}

func TestF6RunsTheAtomicAnalogueWithoutACommitGap(t *testing.T) {
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return atomicOnly{h.(*memHarness)}, nil
	}, "F6")
	for _, want := range []string{
		"  skip commit gap: one atomic request, nothing to pause",
		"ok   [I3] A then B: the final data is token 2's and the floor is 2",
		"ok   [I3] B then A: the second writer (token 1) is judged against the advanced floor (expected=first=true second=false",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if sum.Failed != 0 || sum.Passed < 5 {
		t.Errorf("passed=%d failed=%d:\n%s", sum.Passed, sum.Failed, out)
	}
}
