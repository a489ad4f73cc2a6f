package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

var allPhases = []string{"pg-per-lease", "pg-sessions", "etcd-1", "etcd-3"}

type config struct {
	holders, names, procs, conns int
	ttl, duration, setupTimeout  time.Duration
	phases                       []string
	satClients, satRounds        int
	satTime                      time.Duration
	out                          string
	// slowDisk, when set, is the fsync delay of the slow disk the
	// servers' data directories are put on (-slow-disk).
	slowDisk         *time.Duration
	stdout, progress io.Writer
	// exe is the binary re-executed as holder processes and etcd members
	// (default: this one); tests set it.
	exe string
	// holderArgs and etcdArgs are the arguments that make exe a holder
	// process and an etcd member (default "holders" and "etcd-server").
	holderArgs, etcdArgs []string
	// slowDiskArgs make exe the slow-disk process (default "slow-disk").
	slowDiskArgs []string
}

func (c *config) check() error {
	switch {
	case c.holders < 1 || c.names < 1 || c.names > 999 || c.holders > 99999:
		return fmt.Errorf("-holders %d -names %d: want 1-99999 holders of 1-999 names", c.holders, c.names)
	case c.procs < 1 || c.procs > c.holders:
		return fmt.Errorf("-procs %d: want 1 to -holders", c.procs)
	case c.conns < 1 || c.satClients < 1 || c.satRounds < 1:
		return errors.New("-conns, -sat-clients and -sat-rounds must be at least 1")
	case c.ttl%time.Second != 0 || c.ttl < 3*time.Second:
		return fmt.Errorf("-ttl %v: want whole seconds, at least 3s (etcd lease TTLs are whole seconds)", c.ttl)
	case c.duration <= 0 || c.satTime <= 0 || c.setupTimeout <= 0:
		return errors.New("-duration, -sat-time and -setup-timeout must be positive")
	}
	for _, p := range c.phases {
		if !slices.Contains(allPhases, p) {
			return fmt.Errorf("-phases: unknown phase %q (want some of %s)", p, strings.Join(allPhases, ","))
		}
	}
	return nil
}

// fullScale reports whether the run is at full scale: the 1,000,000 leases, TTL 15 s and 60 s
// window docs/capacity.md reports.
func (c *config) fullScale() bool {
	return c.holders*c.names >= 1_000_000 && c.duration >= 60*time.Second && c.ttl == 15*time.Second
}

// phaseResult is what one phase measured.
type phaseResult struct {
	name, ratioName                           string
	reference                                 bool // pg-per-lease: see runResult.valid
	server                                    string
	skipped                                   string // why the phase did not run
	workers                                   []workerMsg
	setup                                     time.Duration
	window                                    float64 // mean window of the holder processes, s
	renewOK                                   int64
	renewFailed                               int64
	failedTotal                               int64
	names                                     int64
	rate                                      float64 // renewals/s achieved: sum over processes of ok/window
	p50, p99, pmax                            time.Duration
	acquired, acqErr, retries                 int
	held, missing, lostDL, lostSrv, lostOther int
	upsert, renew                             float64 // saturated rates (medians)
	upserts, renews, ones                     []measured
	one                                       float64 // Renew of one name at saturation (median)
	// Server CPU (cores) in the window and at saturation (medians).
	windowCores, upsertCores, renewCores float64
	idleCores                            float64 // right after the holders, no client
	firstError                           string
}

func (p *phaseResult) ratio() float64 { return p.rate / p.renew }

func (p *phaseResult) valid() bool {
	// A failed renewal attempt that the next one made good loses nothing:
	// it is printed, but only lost names and failed acquires fail a phase.
	return p.skipped != "" || (p.missing == 0 && p.acqErr == 0 && p.renewOK > 0)
}

type runResult struct{ phases []*phaseResult }

// valid reports whether every phase but the per-lease reference kept all
// its names: pg-per-lease is today's design, run to put its figure beside
// holder sessions', and a machine that cannot keep up with it is a finding
// of the run (printed as such), not a failure of the benchmark.
func (r runResult) valid() bool {
	for _, p := range r.phases {
		if !p.reference && !p.valid() {
			return false
		}
	}
	return true
}

// defaultSatClients is -sat-clients' default, the client count of
// latest.txt.
const defaultSatClients = 16

// reportName is the file a full-scale run writes its report to in -out:
// latest.txt, slow-disk-D.txt with -slow-disk D (slow-disk-1ms.txt), and
// either with -sat-clients N other than the default named for it
// (slow-disk-1ms-64-clients.txt), so runs that measure differently never
// overwrite each other.
func (c *config) reportName() string {
	name := "latest"
	if c.slowDisk != nil {
		name = "slow-disk-" + c.slowDisk.String()
	}
	if c.satClients != defaultSatClients {
		name += fmt.Sprintf("-%d-clients", c.satClients)
	}
	return name + ".txt"
}

func run(ctx context.Context, cfg config) (runResult, error) {
	if cfg.exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return runResult{}, err
		}
		cfg.exe = exe
	}
	if cfg.etcdArgs == nil {
		cfg.etcdArgs = []string{"etcd-server"}
	}
	if cfg.holderArgs == nil {
		cfg.holderArgs = []string{"holders"}
	}
	if cfg.slowDiskArgs == nil {
		cfg.slowDiskArgs = []string{slowDiskArg}
	}
	var report bytes.Buffer
	w := io.MultiWriter(cfg.stdout, &report)
	say := func(format string, args ...any) { fmt.Fprintf(cfg.progress, "capacity: "+format+"\n", args...) }
	began := time.Now()
	fmt.Fprintf(w, "# leasefence capacity, %s\n", began.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "# %s %s/%s, %d CPUs; everything on loopback; durability on (fsync, synchronous_commit, etcd WAL fsync)\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	fmt.Fprintf(w, "# %d holders × %d names = %d leases, TTL %v, renewed every %v by one leasecore.SessionSet per holder;\n",
		cfg.holders, cfg.names, cfg.holders*cfg.names, cfg.ttl, renewInterval(cfg.ttl))
	fmt.Fprintf(w, "# %d holder processes, one lease store each (PostgreSQL: on %d connections; etcd: on one client); measured window %v after setup\n",
		cfg.procs, cfg.conns, cfg.duration)
	fmt.Fprintf(w, "# ratio: U = plain single-row upserts/s (etcd: Puts/s), S = the holders' renewal (RenewAll of one holder's\n")
	fmt.Fprintf(w, "# %d names) per second, both at saturation with %d clients, %d rounds × %v each alternating, medians, measured on the\n",
		cfg.names, cfg.satClients, cfg.satRounds, cfg.satTime)
	fmt.Fprintf(w, "# phase's server after its holders are gone; R = renewals/s achieved. A renewal costs C = U/S upserts of capacity;\n")
	fmt.Fprintf(w, "# renewal_load = R×C upsert-equivalents/s; RATIO renewal_load/upsert_capacity = R×C/U = R/S\n")
	fmt.Fprintf(w, "# valid: no phase lost a name (local deadline or server) or failed an acquire; pg-per-lease is the\n")
	fmt.Fprintf(w, "# reference (today's design): its losses are reported (MISSED_LOCAL_DEADLINES_PER_LEASE) but do not fail the run\n")
	if cfg.slowDisk != nil {
		fmt.Fprintf(w, "# A SLOWER DISK: every server's data directory on a FUSE passthrough (internal/slowdisk) to the machine's disk\n")
		fmt.Fprintf(w, "# whose every fsync and fdatasync returns %v later than the disk's own (each flush still reaches the disk)\n", *cfg.slowDisk)
		undo, err := useSlowDisk(ctx, cfg, say)
		if err != nil {
			return runResult{}, err
		}
		defer undo()
	}
	if !cfg.fullScale() {
		fmt.Fprintf(w, "# REDUCED SCALE: not the 1,000,000 leases, TTL 15s, >= 60s of a full-scale run\n")
	}
	var res runResult
	for _, name := range cfg.phases {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		p, err := runPhase(ctx, cfg, name, say)
		if err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
		res.phases = append(res.phases, p)
		p.print(w, cfg)
	}
	fmt.Fprintln(w)
	missed, missedRef, ref := 0, 0, false
	for _, p := range res.phases {
		if p.skipped != "" {
			fmt.Fprintf(w, "# %s: not run: %s\n", p.name, p.skipped)
			continue
		}
		ratio := p.ratio()
		if !p.valid() {
			// A phase whose holders lost names renewed fewer names than
			// the run asked for: its achieved rate understates the load.
			need := float64(cfg.holders) / renewInterval(cfg.ttl).Seconds()
			ratio = max(p.rate, need) / p.renew
			fmt.Fprintf(w, "# %s lost names: its RATIO is at the rate needed, %.1f/s, not at the %.1f/s it achieved\n",
				p.name, need, p.rate)
		}
		fmt.Fprintf(w, "RATIO %s %.3f\n", p.ratioName, ratio)
		fmt.Fprintf(w, "MISSED_LOCAL_DEADLINES_%s %d\n", strings.ReplaceAll(strings.ToUpper(p.name), "-", "_"), p.lostDL)
		if p.reference {
			missedRef, ref = missedRef+p.lostDL, true
		} else {
			missed += p.lostDL
		}
	}
	fmt.Fprintf(w, "MISSED_LOCAL_DEADLINES %d\n", missed)
	if ref {
		fmt.Fprintf(w, "MISSED_LOCAL_DEADLINES_PER_LEASE %d\n", missedRef)
	}
	valid := "valid"
	if !res.valid() {
		valid = "INVALID: names were lost or acquires failed (see the phases above)"
	}
	for _, p := range res.phases {
		if p.reference && !p.valid() {
			valid += fmt.Sprintf("; the %s reference phase did NOT keep up (see above)", p.name)
		}
	}
	fmt.Fprintf(w, "# run: %s; wall time %.0f s\n", valid, time.Since(began).Seconds())
	if cfg.out != "" {
		if !cfg.fullScale() {
			say("reduced scale: no report written to %s", cfg.out)
		} else {
			if err := os.MkdirAll(cfg.out, 0o755); err != nil {
				return res, err
			}
			path := filepath.Join(cfg.out, cfg.reportName())
			if err := os.WriteFile(path, report.Bytes(), 0o644); err != nil {
				return res, err
			}
			say("report written to %s", path)
		}
	}
	return res, nil
}

// phase is one phase's server: where the holders connect, and what it
// measures at saturation.
type phase interface {
	describe() string
	backend() backendConfig
	saturate(ctx context.Context, cfg config, say func(string, ...any)) (satResult, error)
	// pids are the server's processes, for the CPU cross-check.
	pids() []int
	close() error
}

// idleTime is how long a phase watches its server's CPU with no client,
// between the holders and the saturation measurements.
const idleTime = 3 * time.Second

func runPhase(ctx context.Context, cfg config, name string, say func(string, ...any)) (_ *phaseResult, err error) {
	p := &phaseResult{name: name}
	var ph phase
	switch name {
	case "pg-per-lease":
		p.ratioName, p.reference = "renewal_load/upsert_capacity_per_lease", true
		ph, err = startPGPhase(ctx, cfg, false, say)
	case "pg-sessions":
		p.ratioName = "renewal_load/upsert_capacity"
		if !holderSessionsAvailable {
			p.skipped = "fence-pg has no holder sessions yet (holderSessionsAvailable in pgmode.go)"
			return p, nil
		}
		ph, err = startPGPhase(ctx, cfg, true, say)
	case "etcd-1":
		p.ratioName = "etcd_renewal_load/etcd_put_capacity"
		ph, err = startEtcdPhase(ctx, cfg, 1, say)
	case "etcd-3":
		p.ratioName = "etcd_3_members_renewal_load/etcd_3_members_put_capacity"
		ph, err = startEtcdPhase(ctx, cfg, 3, say)
	}
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, ph.close()) }()
	p.server = ph.describe()
	say("%s: %s", name, p.server)
	fmt.Fprintf(cfg.progress, "capacity: %s: starting %d holder processes\n", name, cfg.procs)
	if err := runHolders(ctx, cfg, ph.backend(), ph.pids(), p, say); err != nil {
		return nil, err
	}
	// The server's own background work (autovacuum after the setup's
	// writes, checkpoints) with no client at all, beside the window's CPU.
	cpu0, t0 := serverCPU(ph.pids()), time.Now()
	select {
	case <-time.After(idleTime):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.idleCores = cores(cpu0, serverCPU(ph.pids()), time.Since(t0))
	say("%s: holders done; measuring the server's capacity", name)
	sat, err := ph.saturate(ctx, cfg, say)
	if err != nil {
		return nil, err
	}
	p.upserts, p.renews, p.ones = sat.upserts, sat.renews, sat.ones
	p.one = median(field(p.ones, rateOf))
	p.upsert, p.renew = median(field(p.upserts, rateOf)), median(field(p.renews, rateOf))
	p.upsertCores, p.renewCores = median(field(p.upserts, coresOf)), median(field(p.renews, coresOf))
	return p, nil
}

// runHolders starts the holder processes, waits until every one has
// acquired its names, measures for cfg.duration and collects the results.
func runHolders(ctx context.Context, cfg config, bc backendConfig, pids []int, p *phaseResult, say func(string, ...any)) error {
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		dec   *json.Decoder
	}
	var procs []*proc
	defer func() {
		for _, pr := range procs {
			_ = pr.stdin.Close()
			if pr.cmd.Process != nil {
				_ = pr.cmd.Process.Kill()
			}
			_ = pr.cmd.Wait()
		}
	}()
	per, extra := cfg.holders/cfg.procs, cfg.holders%cfg.procs
	first := 0
	start := time.Now()
	for i := range cfg.procs {
		n := per
		if i < extra {
			n++
		}
		wc := workerConfig{backendConfig: bc, First: first, Count: n, Names: cfg.names, TTL: cfg.ttl, Conns: cfg.conns,
			SetupTimeout: cfg.setupTimeout}
		first += n
		raw, err := json.Marshal(wc)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, cfg.exe, cfg.holderArgs...)
		cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
		cmd.Stderr = cfg.progress
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, &proc{cmd: cmd, stdin: stdin, dec: json.NewDecoder(stdout)})
	}
	read := func(pr *proc, kind string) (workerMsg, error) {
		var m workerMsg
		if err := pr.dec.Decode(&m); err != nil {
			return m, fmt.Errorf("holder process %d: reading its %s: %w", pr.cmd.Process.Pid, kind, err)
		}
		if m.Kind != kind {
			return m, fmt.Errorf("holder process %d: got %q, want %q", pr.cmd.Process.Pid, m.Kind, kind)
		}
		return m, nil
	}
	for _, pr := range procs {
		m, err := read(pr, "ready")
		if err != nil {
			return err
		}
		p.acquired += m.Acquired
		p.acqErr += m.AcquireErrors
		p.retries += m.Retries
		if p.firstError == "" {
			p.firstError = m.FirstError
		}
	}
	p.setup = time.Since(start)
	say("%s: %d leases acquired in %.1f s (%d errors); measuring renewals for %v", p.name, p.acquired, p.setup.Seconds(), p.acqErr, cfg.duration)
	cpu0, t0 := serverCPU(pids), time.Now()
	for _, pr := range procs {
		if _, err := io.WriteString(pr.stdin, "go\n"); err != nil {
			return err
		}
	}
	select {
	case <-time.After(cfg.duration):
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, pr := range procs {
		if _, err := io.WriteString(pr.stdin, "stop\n"); err != nil {
			return err
		}
	}
	p.windowCores = cores(cpu0, serverCPU(pids), time.Since(t0))
	var lat []int64
	for _, pr := range procs {
		m, err := read(pr, "result")
		if err != nil {
			return err
		}
		p.workers = append(p.workers, m)
		p.held += m.Held
		p.missing += m.Missing
		p.lostDL += m.LostDeadline
		p.lostSrv += m.LostServer
		p.lostOther += m.LostOther
		p.renewOK += m.RenewOK
		p.renewFailed += m.RenewFailed
		p.failedTotal += m.RenewFailedTotal
		p.names += m.NamesRenewed
		p.window += m.WindowSeconds / float64(len(procs))
		if m.WindowSeconds > 0 {
			p.rate += float64(m.RenewOK) / m.WindowSeconds
		}
		if m.FirstFailure != "" && p.firstError == "" {
			p.firstError = m.FirstFailure
		}
		lat = append(lat, m.LatencyMicros...)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		q := func(f float64) time.Duration {
			return time.Duration(lat[min(len(lat)-1, int(f*float64(len(lat))))]) * time.Microsecond
		}
		p.p50, p.p99, p.pmax = q(0.50), q(0.99), time.Duration(lat[len(lat)-1])*time.Microsecond
	}
	return nil
}

func (p *phaseResult) print(w io.Writer, cfg config) {
	fmt.Fprintf(w, "\n## %s\n", p.name)
	if p.skipped != "" {
		fmt.Fprintf(w, "not run: %s\n", p.skipped)
		return
	}
	fmt.Fprintf(w, "%s\n", p.server)
	leases := cfg.holders * cfg.names
	fmt.Fprintf(w, "setup: %d of %d leases acquired in %.1f s (%.0f acquires/s through the public API), %d acquire errors, %d retries\n",
		p.acquired, leases, p.setup.Seconds(), float64(p.acquired)/p.setup.Seconds(), p.acqErr, p.retries)
	need := float64(cfg.holders) / renewInterval(cfg.ttl).Seconds()
	fmt.Fprintf(w, "renewals: %.1f/s achieved (needed: %d holders / %v = %.1f/s), %.0f names/s; %d in %.1f s, %d failed\n",
		p.rate, cfg.holders, renewInterval(cfg.ttl), need, float64(p.names)/p.window, p.renewOK, p.window, p.renewFailed)
	fmt.Fprintf(w, "renewal latency (RenewAll of %d names): p50 %s, p99 %s, max %s\n", cfg.names, ms(p.p50), ms(p.p99), ms(p.pmax))
	fmt.Fprintf(w, "local deadlines missed: %d; names lost at the server: %d, otherwise: %d; held at the end %d of %d; renewals failed in the whole run: %d\n",
		p.lostDL, p.lostSrv, p.lostOther, p.held, leases, p.failedTotal)
	if p.firstError != "" {
		fmt.Fprintf(w, "  (%s)\n", p.firstError)
	}
	fmt.Fprintf(w, "capacity (holders gone, %d clients): plain upserts %.0f/s %s; renewals of %d names %.1f/s %s\n",
		cfg.satClients, p.upsert, rates(field(p.upserts, rateOf)), cfg.names, p.renew, rates(field(p.renews, rateOf)))
	c := p.upsert / p.renew
	fmt.Fprintf(w, "one renewal = %.2f upserts; renewal load %.0f upsert-equivalents/s; renewal_load/upsert_capacity = %.3f\n",
		c, p.rate*c, p.ratio())
	fmt.Fprintf(w, "  (at the rate needed, %.1f/s: %.3f; a renewal counted as one upsert, R/U = %.3f)\n", need, need/p.renew, p.rate/p.upsert)
	if p.rate < 0.98*need {
		fmt.Fprintf(w, "renewals FELL BEHIND: %.1f/s achieved of %.1f/s needed\n", p.rate, need)
	}
	if p.reference {
		fmt.Fprintf(w, "Renew of one name: %.0f/s %s (per lease it renews that name only)\n", p.one, rates(field(p.ones, rateOf)))
	} else {
		fmt.Fprintf(w, "Renew of one name: %.0f/s %s; in this mode it extends every name of the holder, without checking\n",
			p.one, rates(field(p.ones, rateOf)))
		fmt.Fprintf(w, "  each: renewals at that cost would make the ratio R/X = %.3f (at the rate needed %.3f)\n", p.rate/p.one, need/p.one)
	}
	fmt.Fprintf(w, "server CPU (cross-check, /proc; cores = CPU s/s): renewal window %s (%s ms per renewal); at saturation\n",
		num(p.windowCores, 2), num(1000*p.windowCores/p.rate, 2))
	fmt.Fprintf(w, "  upserts %s (%s ms each), renewals %s (%s ms each); window / upsert saturation = %s; no client, right\n",
		num(p.upsertCores, 2), num(1000*p.upsertCores/p.upsert, 3), num(p.renewCores, 2), num(1000*p.renewCores/p.renew, 2),
		num(p.windowCores/p.upsertCores, 3))
	fmt.Fprintf(w, "  after the holders, %s (the server's own background work)\n", num(p.idleCores, 2))
	if !p.valid() {
		note := ""
		if p.reference {
			note = " (the per-lease reference: reported, does not fail the run)"
		}
		fmt.Fprintf(w, "INVALID phase: %d names missing, %d acquire errors%s\n", p.missing, p.acqErr, note)
	}
}

// num formats x with prec decimals, "n/a" for NaN (a failed CPU reading).
func num(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

func rateOf(m measured) float64  { return m.rate }
func coresOf(m measured) float64 { return m.cores }

func field(ms []measured, f func(measured) float64) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = f(m)
	}
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func rates(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.0f", x)
	}
	return "(rounds: " + strings.Join(s, ", ") + ")"
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
