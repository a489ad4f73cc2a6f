package main

import (
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"text/template"
	"time"
)

//go:embed limits.md.tmpl
var limitsTemplate string

// limitsRow is one configuration's figures for LIMITS.md, read from the
// lines its run printed, and the findings computed from them.
type limitsRow struct {
	Name, Downtime, Remaining, ExpiryAfterStop string
	Passed, Failed                             int

	// CrashTTL and StopTTL are the TTLs F8 and F4 used, as printed.
	CrashTTL, StopTTL string
	// DowntimeFinding and ExpiryFinding are what the figures show, in
	// words; they change when the figures do.
	DowntimeFinding, ExpiryFinding string

	// DelayFinding (F14), ClockFinding (F15) and FailoverFinding (F16) are
	// what the cases for the boundaries the lease-fencing article
	// (SOURCES.md) names but does not test printed.
	DelayFinding, ClockFinding, FailoverFinding string
}

var (
	reDowntime  = regexp.MustCompile(`down for (\S+)`)
	reRemaining = regexp.MustCompile(`held=\w+ with (\S+) left`)
	reCrashTTL  = regexp.MustCompile(`left of its ttl (\S+)`)
	reExpiry    = regexp.MustCompile(`expired by the backend's clock (\S+) after SIGSTOP`)
	reStopTTL   = regexp.MustCompile(`(?m)^CASE F4 ::.*\n  note resource=\S+; ttl=(\S+) `)

	reDelayHeld    = regexp.MustCompile(`A's write was held in the network for (\S+) `)
	reDelayVerdict = regexp.MustCompile(`  (ok  |FAIL) \[I3\] A's delayed write with token \d+ is rejected`)
	reClockBelief  = regexp.MustCompile(`A believed itself valid for at least (\S+) past the backend's expiry`)
	reClockVerdict = regexp.MustCompile(`  (ok  |FAIL) \[I3\] A's write with token \d+, sent while its session was valid by its own clock, is rejected`)
	reFailover     = regexp.MustCompile(`(?m)^  -- synchronous replication\n(?s:.*?)  note failover: (.*); writes unavailable for (\S+)\n`)
	reFailoverNew  = regexp.MustCompile(`\[I2\] holder-c's token after the failover is larger than every token handed out before it[^\n]*\(expected=([^,]+), actual=([^)]+)\)`)
	reReissue      = regexp.MustCompile(`negative control exposes: the promoted asynchronous standby hands out token (\d+) again`)
	reAsyncSkip    = regexp.MustCompile(`skip asynchronous replication: (.*)`)
	reCaseSkip     = regexp.MustCompile(`(?m)^CASE F16 ::.*\n  skip (.*)$`)
)

const notRun = "(not run)"

func newLimitsRow(name, output string, passed, failed int) limitsRow {
	find := func(re *regexp.Regexp) string {
		if m := re.FindStringSubmatch(output); m != nil {
			return m[1]
		}
		return notRun
	}
	r := limitsRow{Name: name, Passed: passed, Failed: failed,
		Downtime: find(reDowntime), Remaining: find(reRemaining), ExpiryAfterStop: find(reExpiry),
		CrashTTL: find(reCrashTTL), StopTTL: find(reStopTTL)}
	r.DowntimeFinding = downtimeFinding(r.CrashTTL, r.Downtime, r.Remaining)
	r.ExpiryFinding = expiryFinding(r.StopTTL, r.ExpiryAfterStop)
	r.DelayFinding = delayFinding(output)
	r.ClockFinding = clockFinding(output)
	r.FailoverFinding = failoverFinding(output)
	return r
}

// verdict turns a check line's kind into words.
func verdict(m []string) string {
	if m == nil {
		return "not checked"
	}
	if m[1] == "FAIL" {
		return "NOT rejected (FAIL)"
	}
	return "rejected"
}

// delayFinding is F14's: how long the write sat in the proxy, and what the
// fence did with it.
func delayFinding(out string) string {
	m := reDelayHeld.FindStringSubmatch(out)
	if m == nil {
		return "F14 did not run here: nothing measured"
	}
	return fmt.Sprintf("a write sent while the lease was valid, held in a TCP proxy for %s and delivered after the next holder wrote, was %s by the fence",
		m[1], verdict(reDelayVerdict.FindStringSubmatch(out)))
}

// clockFinding is F15's: how long a session on a slow clock believed
// itself valid past the backend's expiry, and what the fence did.
func clockFinding(out string) string {
	m := reClockBelief.FindStringSubmatch(out)
	if m == nil {
		return "F15 did not run here: nothing measured"
	}
	return fmt.Sprintf("a session whose clock ran at a quarter of real time believed itself valid for at least %s past the backend's expiry; its write was %s by the fence",
		m[1], verdict(reClockVerdict.FindStringSubmatch(out)))
}

// failoverFinding is F16's: the synchronous failover's downtime and next
// token, and what the asynchronous negative control did.
func failoverFinding(out string) string {
	if m := reCaseSkip.FindStringSubmatch(out); m != nil {
		return "F16 skipped: " + m[1]
	}
	m := reFailover.FindStringSubmatch(out)
	if m == nil {
		return "F16 did not run here: nothing measured"
	}
	s := fmt.Sprintf("synchronous: %s; writes unavailable for %s", m[1], m[2])
	if n := reFailoverNew.FindStringSubmatch(out); n != nil {
		s += fmt.Sprintf("; the next token after it: expected %s, got %s", n[1], n[2])
	}
	switch {
	case reReissue.MatchString(out):
		s += fmt.Sprintf("; asynchronous (negative control): the promoted standby handed token %s out a second time", reReissue.FindStringSubmatch(out)[1])
	case reAsyncSkip.MatchString(out):
		s += "; asynchronous: " + reAsyncSkip.FindStringSubmatch(out)[1]
	default:
		s += "; asynchronous (negative control): no token was handed out twice (the control did not fire)"
	}
	return s
}

// slack absorbs the time between the figures' readings (the acquire, the
// crash, the read after the restart): a few round trips on loopback.
const slack = 100 * time.Millisecond

// downtimeFinding says whether the lease's TTL kept running while the
// server was down, from F8's figures: a lease that came back with no more
// than TTL minus the downtime left kept counting; one that came back with
// (about) its whole TTL did not.
func downtimeFinding(ttlS, downS, leftS string) string {
	ttl, err1 := time.ParseDuration(ttlS)
	down, err2 := time.ParseDuration(downS)
	left, err3 := time.ParseDuration(leftS)
	if err1 != nil || err2 != nil || err3 != nil {
		return "F8 did not run here: nothing measured"
	}
	figures := fmt.Sprintf("down %v, the lease (TTL %v) came back with %v left", down, ttl, left)
	switch {
	case left+down <= ttl+slack:
		return figures + ": at most TTL minus the downtime, so the TTL kept running while the server was down"
	case left >= ttl-slack:
		return figures + ": its whole TTL again, so the downtime did not count against it"
	default:
		return figures + ": more than TTL minus the downtime but less than the whole TTL, so part of the downtime did not count"
	}
}

// expiryFinding relates the time the lease took to expire after SIGSTOP
// to F4's TTL: within it (the TTL counted from A's last renewal before
// the freeze) or beyond it (by how much the backend was late).
func expiryFinding(ttlS, expS string) string {
	ttl, err1 := time.ParseDuration(ttlS)
	exp, err2 := time.ParseDuration(expS)
	if err1 != nil || err2 != nil {
		return "F4 did not run here: nothing measured"
	}
	figures := fmt.Sprintf("expired %v after SIGSTOP with a TTL of %v", exp, ttl)
	if exp <= ttl+slack {
		return figures + ": within the TTL, which counted from A's last renewal before the freeze"
	}
	return figures + fmt.Sprintf(": %v later than a TTL counted from the freeze itself, the time the backend took to notice the expiry", (exp-ttl).Round(time.Millisecond))
}

// writeLimits writes LIMITS.md from the template and the run's figures.
func (l *lab) writeLimits(pgVersion string, rows []limitsRow) error {
	if len(rows) == 0 {
		return nil
	}
	f, err := os.Create(filepath.Join(l.outDir, "LIMITS.md"))
	if err != nil {
		return err
	}
	err = renderLimits(f, pgVersion, time.Now(), rows)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// renderLimits executes the template for rows.
func renderLimits(w io.Writer, pgVersion string, at time.Time, rows []limitsRow) error {
	var names []string
	for _, r := range rows {
		names = append(names, r.Name)
	}
	t, err := template.New("limits").Parse(limitsTemplate)
	if err != nil {
		return err
	}
	return t.Execute(w, map[string]any{
		"Date":      at.UTC().Format(time.RFC3339),
		"PGVersion": pgVersion,
		"GoVersion": runtime.Version(),
		"CPUs":      runtime.NumCPU(),
		"Configs":   strings.Join(names, ", "),
		"Rows":      rows,
	})
}
