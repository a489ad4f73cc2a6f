package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// testCase is one experiment of the suite.
type testCase struct {
	id    string // "F1", "F4u"
	name  string // subtest name, "F1_normal_path"
	title string // header text
	run   func(ctx context.Context, c *caseRun, h Harness)
}

// cases lists the suite in order. Each case lives in its own file.
var cases = []testCase{
	{"F1", "F1_normal_path", "normal path: acquire -> write -> renew -> release -> the next holder acquires a larger token and writes", caseF1},
	{"F2", "F2_long_transaction_now", "long transaction: now() stands still; an equal token writes again", caseF2},
	{"F3", "F3_concurrent_acquire", "concurrent acquire: 16 clients behind a barrier, three rounds (fresh, valid, expired)", caseF3},
	{"F4", "F4_paused_stale_holder", "paused stale holder: A is frozen with SIGSTOP after its check; B takes over; A's write is rejected", caseF4},
	{"F5", "F5_unfenced_negative_control", "negative control: the identical timeline against a resource that does not check tokens", caseF5},
	{"F6", "F6_check_then_write_race", "check-then-write race: separate read and write vs the conditional floor update", caseF6},
	{"F7", "F7_fence_granularity", "fence granularity: a stale holder writes a part the new holder never touched", caseF7},
	{"F8", "F8_server_crash", "server crash: immediate stop without checkpoint, recovery; tokens and floor survive", caseF8},
	{"F9", "F9_unfenceable_side_effects", "side effects that cannot be fenced: deduplication keeps the first, not the newest", caseF9},
	{"F9b", "F9b_fenced_outbox", "the fenced outbox: the side effect recorded in the fenced transaction and relayed with the token as its version; the stale holder's publication never reaches the downstream, in both orders; a relay killed with SIGKILL mid-delivery neither loses nor duplicates an accepted delivery", caseF9b},
	{"F1u", "F1u_user_data_normal_path", "normal path, fencing the suite's own tables/keys in the caller's transaction: acquire -> write rows -> renew -> release -> the next holder writes rows with a larger token", caseF1u},
	{"F4u", "F4u_user_data_paused_stale_holder", "paused stale holder, fencing the suite's own tables/keys: A is frozen with SIGSTOP between its check and its transaction; B takes over; A's transaction is rejected and its rows never appear", caseF4u},
	{"F4m", "F4m_marker_first_negative_control", "negative control for user data: a fenced marker first, the rows second with no fence, on F4u's timeline; the frozen holder's stale rows win", caseF4m},
	{"F6u", "F6u_user_data_commit_race", "commit race, fencing the suite's own tables/keys: the rows in one transaction, paused before the commit, which decides; the other writer never waits on the fence for it", caseF6u},
	{"F7u", "F7u_user_data_granularity", "fence granularity, fencing the suite's own tables/keys: a stale holder's rows for a part the new holder never wrote are rejected", caseF7u},
	{"F10u", "F10u_user_data_advance", "advance, fencing the suite's own tables/keys: the new holder raises the floor without writing; the old holder's rows are rejected", caseF10u},
	{"F11", "F11_campaign_handoff", "leader election with leasecore.Campaign: four campaigners, the leader steps down, exactly one waiter takes over with a larger token; the hand-off time is measured", caseF11},
	{"F12", "F12_frozen_leader_handoff", "leader election across a frozen leader: A, a separate process leading under leasecore.Campaign, is frozen with SIGSTOP; a waiter takes over with a larger token; A's late write is rejected; A's campaign leads again after the new leader steps down", caseF12},
	{"F13", "F13_partitioned_leader", "a leader that loses the lease while its function runs: A's network is cut; its lead context ends at its local deadline, before B is granted the lease; A's campaign leads again after B steps down", caseF13},
	{"F14", "F14_network_delayed_write", "network-delayed write: A's write leaves A while its lease is valid, is held in a TCP proxy while the lease expires and B writes with a larger token, then is delivered: the fence rejects it; the unfenced resource accepts it (negative control)", caseF14},
	{"F15", "F15_clock_rate_fault", "clock-rate fault: A's session clock runs slower than the server's; A believes itself valid after the server expired its lease; B takes over; A's write is rejected; a clock within the rate the margin covers keeps A's deadline before the server's expiry", caseF15},
	{"F16", "F16_failover", "failover on a replicated server: with a synchronous standby (etcd: a 3-member cluster) the primary (leader) is crashed and another member serves; no token is reused, the lease and the floor survive, the stale holder is rejected; negative control: a lagging asynchronous standby promoted after the crash hands out a token again", caseF16},
	{"F17", "F17_scope_migration", "scope migration: the scope's data moves to another server (PostgreSQL: another database; etcd: another cluster) with its floor, sealing the old location; A, paused across the move with a token B took over before it, writes to the new location and is rejected; the old location rejects everybody and says where the scope went; negative control: the data moved without its floor lets A's stale write in", caseF17},
	{"F18", "F18_frozen_inside_transaction", "frozen or slow inside the fenced transaction: A is frozen with SIGSTOP after its first row, past its lease; B acquires, advances without waiting and writes the same rows with no fence; A wakes, goes on and is rejected at its commit; a slow A (a statement every 100 ms past its lease) is rejected at its commit too; negative control: the check first, holding the floor, makes B wait for A and lets A's stale rows commit", caseF18},
	{"X1", "X1_bad_input", "bad input: every entry point names the bad field, wraps the sentinel and changes nothing", caseX1},
	{"X2", "X2_lease_contract", "the lease contract where lock-based lease services break it: holds that are over, a retried release, TTLs as asked, a holder that stops renewing, re-entrant acquire, independent names, a second client, a lost acquire answer", caseX2},
}

// CaseIDs returns the IDs of the suite's cases ("F1", "F4u", "X2", ...) in
// the order Run and Report run them: what ReportOptions.Cases selects from.
// A tool that spreads the cases over several servers, one Report call per
// case, takes them from here.
func CaseIDs() []string {
	ids := make([]string, len(cases))
	for i, tc := range cases {
		ids[i] = tc.id
	}
	return ids
}

// caseTimeout bounds one case; it grows with the backend's minimum TTL.
func caseTimeout(t Traits) time.Duration {
	return 2*time.Minute + 30*t.MinTTL
}

// Run runs every case of the suite as a subtest of t, each with a fresh
// Harness from newHarness: t.Run("F1_normal_path", ...), and so on.
func Run(t *testing.T, newHarness NewHarness) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := runCase(t.Context(), tc, newHarness, func(traits Traits) *caseRun {
				return newTestC(t.Context(), traits, t)
			})
			if c.skipReason != "" && c.passed == 0 && c.failed == 0 {
				t.Skip(c.skipReason)
			}
			if c.failed > 0 {
				// What the processes, the lease and the resource did, and
				// when: a failure that depends on timing is read here.
				for _, ev := range c.timeline {
					fmt.Fprintln(t.Output(), formatLine("", fmt.Sprintf("timeline %9.3fs %-8s %s", ev.At.Seconds(), ev.Lane, ev.Text)))
				}
			}
		})
	}
}

// runCase runs tc with a fresh harness; newC makes the case's caseRun once the
// harness's traits are known.
func runCase(parent context.Context, tc testCase, newHarness NewHarness, newC func(Traits) *caseRun) *caseRun {
	// The harness is created under a bounded context, before the traits
	// (and so the case timeout) are known.
	setupCtx, cancelSetup := context.WithTimeout(parent, 2*time.Minute)
	h, err := newHarness(setupCtx)
	cancelSetup()
	if err != nil {
		c := newC(Traits{})
		c.id, c.st = tc.id, &caseState{start: time.Now()}
		c.line(kindFail, "harness: "+err.Error())
		return c
	}
	traits := h.Traits()
	ctx, cancel := context.WithTimeout(parent, caseTimeout(traits))
	defer cancel()
	c := newC(traits)
	c.id, c.ctx = tc.id, ctx
	c.st = &caseState{start: time.Now()}
	c.protect(func() { tc.run(ctx, c, h) })
	c.timeline = c.st.finish()
	if err := h.Close(); err != nil {
		c.line(kindFail, "harness close: "+err.Error())
	}
	return c
}

// need returns the harness's implementation of the optional interface T
// for ability ab. When the harness declares ab absent, the case (or
// section) skips with the declared reason; when it lacks T without
// declaring so, the case fails.
func need[T any](c *caseRun, h Harness, ab Ability) T {
	// A declared absence wins even over an implementation: the harness
	// knows when it cannot use what its type could do (no cluster to
	// crash, no way to re-execute itself).
	if reason, ok := c.traits.Absent[ab]; ok {
		c.Skip(fmt.Sprintf("%s: %s", ab, reason))
	}
	if v, ok := h.(T); ok {
		return v
	}
	var zero T
	if since, ok := graceAbilities[ab]; ok {
		c.Skip(fmt.Sprintf("%s: the harness neither implements %T nor declares it absent; the ability is new (%s), "+
			"so this skips until the harness is updated instead of failing", ab, &zero, since))
	}
	c.Fatalf("the harness neither implements %T (%s) nor declares it absent in Traits.Absent", &zero, ab)
	return zero
}

// graceAbilities are abilities added after the repository's own harnesses
// were written, with where they were added. A case needing one skips, with
// a skip line saying why, when the harness neither implements nor declares
// it, instead of failing: the backends' suites stay green while their
// harnesses catch up. An entry is removed as soon as every harness in the
// repository implements the ability or declares it absent; from then on
// the usual rule (an undeclared ability fails) applies to it too. The list
// is here, in the open, so that nothing passes by a switch nobody sees.
var graceAbilities = map[Ability]string{}

// Summary is the result of Report.
type Summary struct {
	Passed, Failed, Skipped int
	Cases                   []CaseResult
}

// CaseResult is the outcome of one case in Report.
type CaseResult struct {
	ID, Name, Title string // "F4", "F4_paused_stale_holder", the header text
	Passed, Failed  int
	Skipped         string // the reason, when the whole case skipped
	Elapsed         time.Duration
	// Timeline holds the events the case recorded, in time order (F4 and
	// F5 record their processes, the lease and the resource).
	Timeline []TimelineEvent
}

// ReportOptions configures Report.
type ReportOptions struct {
	// Cases selects cases by ID ("F1", "F4", ...; see CaseIDs), run in
	// the order given; empty runs all.
	Cases []string
	// Progress, when set, is called before each case starts (done false)
	// and after it ends (done true, res filled in).
	Progress func(index, total int, res CaseResult, done bool)
}

// Report runs the suite outside go test and writes the line format of the
// lease-fencing article (SOURCES.md) to w: a "CASE Fn :: title" header per
// case, one "ok", "FAIL", "note" or "skip" line per check, and a final
// "SUMMARY passed=N failed=M" line. It returns an error only when writing
// to w fails or a selected case does not exist; check Summary.Failed for
// the verdict.
func Report(ctx context.Context, w io.Writer, newHarness NewHarness, opts ReportOptions) (Summary, error) {
	selected := cases
	if len(opts.Cases) > 0 {
		selected = nil
		for _, id := range opts.Cases {
			i := slices.IndexFunc(cases, func(tc testCase) bool { return strings.EqualFold(tc.id, id) })
			if i < 0 {
				return Summary{}, fmt.Errorf("conformance: no case %q: %w", id, leasecore.ErrInvalidArgument)
			}
			selected = append(selected, cases[i])
		}
	}
	var sum Summary
	var werr error
	write := func(s string) {
		if werr == nil {
			_, werr = io.WriteString(w, s+"\n")
		}
	}
	for i, tc := range selected {
		if err := ctx.Err(); err != nil {
			return sum, errors.Join(werr, err)
		}
		res := CaseResult{ID: tc.id, Name: tc.name, Title: tc.title}
		if opts.Progress != nil {
			opts.Progress(i, len(selected), res, false)
		}
		write(fmt.Sprintf("CASE %s :: %s", tc.id, tc.title))
		start := time.Now()
		c := runCase(ctx, tc, newHarness, func(traits Traits) *caseRun {
			return &caseRun{ctx: ctx, traits: traits, emit: func(kind, text string) { write(formatLine(kind, text)) }}
		})
		res.Passed, res.Failed, res.Elapsed, res.Timeline = c.passed, c.failed, time.Since(start), c.timeline
		if c.skipReason != "" && c.passed == 0 && c.failed == 0 {
			res.Skipped = c.skipReason
			sum.Skipped++
		}
		sum.Passed += c.passed
		sum.Failed += c.failed
		sum.Cases = append(sum.Cases, res)
		if opts.Progress != nil {
			opts.Progress(i, len(selected), res, true)
		}
	}
	write(fmt.Sprintf("SUMMARY passed=%d failed=%d", sum.Passed, sum.Failed))
	return sum, werr
}
