//go:build linux

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/leasecore"
	leasefencemetrics "github.com/leasefence/leasefence/metrics"
)

// The expected series, with the metadata a scrape carries.
const (
	writesHelp = `# HELP leasefence_fenced_writes_total Fenced writes by outcome: "accepted", or "rejected" (the token was below the scope's floor: a stale holder cut off).
# TYPE leasefence_fenced_writes_total counter
`
	lossesHelp = `# HELP leasefence_losses_total Sessions that ended other than by Close, by reason: "lost" (the hold was over: expired or taken over) or "local_deadline" (no renewal succeeded in time).
# TYPE leasefence_losses_total counter
`
	acquiresHelp = `# HELP leasefence_acquires_total Lease acquires by this process's sessions, by outcome: "acquired", "held" (another holder has the lease) or "failed".
# TYPE leasefence_acquires_total counter
`
)

// TestFrozenHolderMetrics is F4 with the metrics on: holder A, a separate
// OS process with its own registry served over HTTP, acquires the lease,
// advances the fence and passes its pre-write check; it is frozen with
// SIGSTOP right before its write. Its lease expires by the database clock,
// holder B (this process, with a registry of its own) takes over with a
// larger token and writes. A is thawed and its very next instruction is
// the write: the fence rejects it. Scraping A's registry then finds
// exactly one rejected write (and one accepted: its Advance), the loss of
// its session at the local deadline, and A's log says the same; B's
// registry has no rejection at all.
func TestFrozenHolderMetrics(t *testing.T) {
	ctx := t.Context()
	cluster := pgtemp.StartTB(t)
	if err := cluster.CreateDatabase(ctx, "f4"); err != nil {
		t.Fatal(err)
	}
	dsn := cluster.DSN("f4")
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	// Holder B's side, in this process.
	regB := prometheus.NewRegistry()
	mB, err := leasefencemetrics.New(regB)
	if err != nil {
		t.Fatal(err)
	}
	var logB bytes.Buffer
	loggerB := slog.New(slog.NewJSONHandler(&logB, nil))
	leases, err := fencepg.NewLeaseStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	fence, err := fencepg.NewFence(pool, fencepg.WithFenceObserver(mB.ObserveFence), fencepg.WithLogger(loggerB))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(leases.Migrate(ctx), fence.Migrate(ctx)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, invoiceDDL); err != nil {
		t.Fatal(err)
	}

	a := startHolder(t, dsn)
	metricsA := "http://" + a.addr + "/metrics"
	t.Logf("holder A (pid %d): token %d, metrics at %s", a.pid, a.token, metricsA)
	// Before the freeze: A's Advance was accepted, nothing was rejected.
	if err := testutil.ScrapeAndCompare(metricsA, strings.NewReader(writesHelp+fmt.Sprintf(
		"leasefence_fenced_writes_total{outcome=\"accepted\",scope=%q} 1\n", scope)), "leasefence_fenced_writes_total"); err != nil {
		t.Fatalf("A's metrics before the freeze: %v", err)
	}

	// Freeze A right before its write.
	if err := syscall.Kill(a.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, a.pid, "T")
	frozenAt := time.Now()
	// Its registry is frozen with it: a scrape gets no answer.
	if _, err := (&http.Client{Timeout: 300 * time.Millisecond}).Get(metricsA); err == nil {
		t.Fatal("a scrape of frozen A was answered")
	}

	// B takes over once A's lease expired by the database clock.
	var sessB *leasecore.Session
	for sessB == nil {
		sessB, err = leasecore.NewSession(ctx, leases, lease, "holder-b",
			leasecore.WithTTL(f4TTL), leasecore.WithRenewInterval(f4Renew), leasecore.WithMargin(f4Margin),
			leasecore.WithSessionObserver(mB.ObserveSession), leasecore.WithLogger(loggerB))
		switch {
		case errors.Is(err, leasecore.ErrHeld) && time.Since(frozenAt) < 10*f4TTL:
			time.Sleep(50 * time.Millisecond)
		case err != nil:
			t.Fatalf("B's acquire: %v", err)
		}
	}
	t.Cleanup(func() { _ = sessB.Close(context.Background()) })
	claimB := sessB.Claim(scope)
	t.Logf("holder B: token %d, %v after A froze", claimB.Token, time.Since(frozenAt).Round(time.Millisecond))
	if claimB.Token <= a.token {
		t.Fatalf("B's token %d is not above A's %d", claimB.Token, a.token)
	}
	if res, err := fence.Advance(ctx, claimB); err != nil || !res.Accepted {
		t.Fatalf("B's advance: %+v, %v", res, err)
	}
	if res, err := fence.RunTx(ctx, claimB, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, insertRow, claimB.Writer, int64(claimB.Token))
		return err
	}); err != nil || !res.Accepted {
		t.Fatalf("B's write: %+v, %v", res, err)
	}

	// Thaw A: its write comes next, and is rejected.
	if err := syscall.Kill(a.pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if got, want := a.call(t, "WRITE"), fmt.Sprintf("RESULT accepted=false floor=%d", claimB.Token); got != want {
		t.Fatalf("A's write: %q, want %q", got, want)
	}

	// Scrape A during the run: exactly one rejected write, and its session
	// lost at the local deadline (reported by A's renewal goroutine once
	// it ran again, so poll for it).
	wantA := writesHelp + fmt.Sprintf("leasefence_fenced_writes_total{outcome=\"accepted\",scope=%q} 1\n", scope) +
		fmt.Sprintf("leasefence_fenced_writes_total{outcome=\"rejected\",scope=%q} 1\n", scope) +
		lossesHelp + fmt.Sprintf("leasefence_losses_total{name=%q,reason=\"local_deadline\"} 1\n", lease) +
		acquiresHelp + fmt.Sprintf("leasefence_acquires_total{name=%q,outcome=\"acquired\"} 1\n", lease)
	var scrapeErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if scrapeErr = testutil.ScrapeAndCompare(metricsA, strings.NewReader(wantA),
			"leasefence_fenced_writes_total", "leasefence_losses_total", "leasefence_acquires_total"); scrapeErr == nil {
			break
		}
	}
	if scrapeErr != nil {
		t.Fatalf("A's metrics after its write: %v", scrapeErr)
	}
	if body, err := scrape(metricsA); err == nil {
		t.Logf("scrape of A after its write (leasefence_ series):\n%s", leasefenceSeries(body))
	}
	if n, err := scrapeCount(metricsA, "leasefence_local_deadline_remaining_seconds"); err != nil || n != 0 {
		t.Errorf("A's deadline gauge after the loss: %d series (%v), want none", n, err)
	}

	// B's registry: its writes accepted, no rejection; its acquire after
	// being refused while A's lease ran.
	wantB := writesHelp + fmt.Sprintf("leasefence_fenced_writes_total{outcome=\"accepted\",scope=%q} 2\n", scope)
	if err := testutil.GatherAndCompare(regB, strings.NewReader(wantB), "leasefence_fenced_writes_total"); err != nil {
		t.Errorf("B's metrics: %v", err)
	}
	if n, err := testutil.GatherAndCount(regB, "leasefence_acquires_total"); err != nil || n != 2 {
		t.Errorf("B's acquire series: %d (%v), want acquired and held", n, err)
	}

	// The metrics agree with the fence's own attempt log and the rows.
	attempts, err := fence.Attempts(ctx, leasecore.AttemptQuery{Scope: scope, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 1 || attempts[0].Accepted || attempts[0].Token != a.token || attempts[0].Floor != claimB.Token {
		t.Errorf("attempt log %+v, want A's one rejected write (token %d, floor %d)", attempts, a.token, claimB.Token)
	}
	var rows string
	if err := pool.QueryRow(ctx, `SELECT string_agg(writer || '/' || token, ',') FROM invoice`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("holder-b/%d", claimB.Token); rows != want {
		t.Errorf("invoice rows %q, want B's only: %q", rows, want)
	}

	// A's log: acquired with its token, the stale write rejected with the
	// floor that beat it, the lease lost at the local deadline.
	a.exit(t)
	t.Logf("A's log:\n%s", a.stderr.String())
	recs := a.logRecords(t)
	for _, want := range []struct {
		msg   string
		attrs map[string]any
	}{
		{"lease acquired", map[string]any{"lease": lease, "holder": "holder-a", "token": float64(a.token)}},
		{"stale write rejected", map[string]any{"level": "WARN", "op": "run tx", "scope": scope,
			"token": float64(a.token), "floor": float64(claimB.Token)}},
		{"lease lost", map[string]any{"level": "WARN", "reason": "local deadline", "token": float64(a.token)}},
	} {
		if !hasRecord(recs, want.msg, want.attrs) {
			t.Errorf("A's log has no %q record with %v:\n%s", want.msg, want.attrs, a.stderr.String())
		}
	}
	if recs := logLines(t, &logB); !hasRecord(recs, "lease acquired", map[string]any{"holder": "holder-b", "token": float64(claimB.Token)}) ||
		hasRecord(recs, "stale write rejected", nil) {
		t.Errorf("B's log: want its acquire and no rejection:\n%s", logB.String())
	}
}

// holder is the parent's handle on holder A.
type holder struct {
	pid    int
	addr   string
	token  leasecore.Token
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr *lockedBuffer
	done   chan error
}

// startHolder starts holder A and waits for its READY line.
func startHolder(t *testing.T, dsn string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+dsn)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	h := &holder{stderr: &lockedBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = h.stderr
	var err error
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.pid = cmd.Process.Pid
	go func() { h.done <- cmd.Wait() }()
	t.Cleanup(func() {
		// Whatever happened, leave no process behind, stopped or not.
		_ = syscall.Kill(h.pid, syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-h.done
	})
	h.lines = bufio.NewScanner(stdout)
	line := h.next(t, "starting")
	if _, err := fmt.Sscanf(line, "READY %s %d", &h.addr, &h.token); err != nil {
		t.Fatalf("holder A: %q, want READY <address> <token>", line)
	}
	return h
}

// next returns A's next stdout line, failing on an error line or an exit.
func (h *holder) next(t *testing.T, what string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if h.lines.Scan() {
			got <- h.lines.Text()
		}
		close(got)
	}()
	select {
	case line, ok := <-got:
		if !ok || strings.HasPrefix(line, "ERROR") {
			t.Fatalf("holder A while %s: %q; stderr:\n%s", what, line, h.stderr.String())
		}
		return line
	case <-time.After(30 * time.Second):
		t.Fatalf("holder A said nothing within 30s while %s; stderr:\n%s", what, h.stderr.String())
	}
	return ""
}

// call sends a line to A and returns its answer.
func (h *holder) call(t *testing.T, line string) string {
	t.Helper()
	if _, err := io.WriteString(h.stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
	return h.next(t, line)
}

// exit closes A's stdin and waits for it to end.
func (h *holder) exit(t *testing.T) {
	t.Helper()
	_ = h.stdin.Close()
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		if err != nil {
			t.Errorf("holder A exited: %v; stderr:\n%s", err, h.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("holder A did not exit")
	}
}

// logRecords parses A's JSON log (its stderr).
func (h *holder) logRecords(t *testing.T) []map[string]any {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(h.stderr.String())
	return logLines(t, &b)
}

func logLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue // not a log record (a panic, the test binary's own output)
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// hasRecord reports whether a record with message msg has every attribute
// of attrs.
func hasRecord(recs []map[string]any, msg string, attrs map[string]any) bool {
next:
	for _, r := range recs {
		if r["msg"] != msg {
			continue
		}
		for k, v := range attrs {
			if r[k] != v {
				continue next
			}
		}
		return true
	}
	return false
}

// scrape returns the text exposition at url.
func scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// scrapeCount scrapes url and counts the series of the metric name.
func scrapeCount(url, name string) (int, error) {
	body, err := scrape(url)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			n++
		}
	}
	return n, nil
}

// leasefenceSeries keeps the samples of leasefence's metrics, without the
// histogram's buckets.
func leasefenceSeries(body string) string {
	var keep []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "leasefence_") && !strings.Contains(line, "_bucket{") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// waitState polls /proc until pid is in state want, failing after 5 s.
func waitState(t *testing.T, pid int, want string) {
	t.Helper()
	var state string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// pid (comm) state ...: comm may hold spaces, so cut at the last ')'.
		if i := bytes.LastIndexByte(data, ')'); i >= 0 {
			if f := strings.Fields(string(data[i+1:])); len(f) > 0 {
				if state = f[0]; state == want {
					return
				}
			}
		}
	}
	t.Fatalf("process %d in state %q, want %q", pid, state, want)
}

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
