package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// workerEnv carries a holder process's workerConfig (JSON); its absence
// tells a stray "capacity holders" that it was not started by capacity.
const workerEnv = "LEASEFENCE_CAPACITY_WORKER"

// workerConfig is one holder process's share of the holders.
type workerConfig struct {
	backendConfig
	First, Count int // holders First .. First+Count-1
	Names        int
	TTL          time.Duration
	Conns        int
	// SetupTimeout bounds the setup: acquires still to do after it fail
	// (counted as acquire errors) and the process reports ready.
	SetupTimeout time.Duration
}

// workerMsg is a line a holder process writes to its stdout: "ready"
// after the setup, "result" after "stop".
type workerMsg struct {
	Kind string

	// ready
	SetupSeconds  float64
	Acquired      int
	AcquireErrors int
	Retries       int
	FirstError    string `json:",omitempty"`

	// result
	Held, Missing                       int // names the sets hold at the end, and lack
	LostDeadline, LostServer, LostOther int // causes reported on the sets' Lost channels
	WindowSeconds                       float64
	RenewOK, RenewFailed, NamesRenewed  int64 // in the window
	RenewFailedTotal                    int64 // over the whole run, setup included
	LatencyMicros                       []int64
	FirstFailure                        string `json:",omitempty"`
}

// recorder counts the RenewAll calls the sets make, and times those that
// answer inside the measured window.
type recorder struct {
	mu          sync.Mutex
	on          bool
	start, end  time.Time
	ok, failed  int64
	names       int64
	failedTotal int64
	lat         []int64
	firstFail   string
}

func (r *recorder) add(took time.Duration, n int, lost []error, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		for _, l := range lost {
			if l != nil {
				err = l
				break
			}
		}
	}
	if err != nil {
		r.failedTotal++
		if r.firstFail == "" {
			r.firstFail = err.Error()
		}
	}
	if !r.on {
		return
	}
	if err != nil {
		r.failed++
		return
	}
	r.ok++
	r.names += int64(n)
	r.lat = append(r.lat, took.Microseconds())
}

func (r *recorder) begin() {
	r.mu.Lock()
	r.on, r.start = true, time.Now()
	r.mu.Unlock()
}

func (r *recorder) stop() {
	r.mu.Lock()
	r.on, r.end = false, time.Now()
	r.mu.Unlock()
}

// timedLease is a store whose RenewAll calls are timed (SessionSet reports
// to no observer; its renewals are the RenewAll calls it makes).
type timedLease struct {
	leaseAPI
	rec *recorder
}

func (t timedLease) RenewAll(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	start := time.Now()
	renewed, lost, err := t.leaseAPI.RenewAll(ctx, gs)
	t.rec.add(time.Since(start), len(gs), lost, err)
	return renewed, lost, err
}

// holdersMain is a holder process: it acquires its holders' names, each
// holder a SessionSet renewing every TTL/3, writes "ready", measures
// between "go" and "stop" on stdin, writes its result and exits without
// releasing anything (the leases expire).
func holdersMain() int {
	raw := os.Getenv(workerEnv)
	if raw == "" {
		fmt.Fprintln(os.Stderr, "capacity holders: started without "+workerEnv+"; capacity starts its holder processes itself")
		return 2
	}
	var wc workerConfig
	if err := json.Unmarshal([]byte(raw), &wc); err != nil {
		fmt.Fprintln(os.Stderr, "capacity holders:", err)
		return 2
	}
	out := json.NewEncoder(os.Stdout)
	ctx := context.Background()
	stores, closeStores, err := openStores(ctx, wc.backendConfig, wc.Conns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capacity holders:", err)
		return 1
	}
	defer closeStores()
	rec := &recorder{}

	// Setup: acquirers take holders from a queue; each holder's names are
	// acquired through its set with one AcquireAll (one statement on
	// PostgreSQL, one transaction per 128 names on etcd).
	start := time.Now()
	setupCtx, cancelSetup := context.WithTimeout(ctx, wc.SetupTimeout)
	defer cancelSetup()
	sets := make([]*leasecore.SessionSet, wc.Count)
	var acquired, acqErrs, retries atomic.Int64
	var lostDL, lostSrv, lostOther atomic.Int64
	var firstErr atomic.Value
	// Each acquirer sends one AcquireAll of a holder's names at a time.
	// Half the pool: the holders' renewals, which start as soon as a
	// holder has its names, find connections free, and the server is
	// saturated well before that (one call is 100 names).
	acquirers := max(1, wc.Conns/2)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range acquirers {
		wg.Go(func() {
			for i := range jobs {
				h := wc.First + i
				store := timedLease{stores[i%len(stores)], rec}
				set, err := leasecore.NewSessionSet(store, holderName(h), leasecore.WithTTL(wc.TTL),
					leasecore.WithRenewInterval(renewInterval(wc.TTL)))
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					acqErrs.Add(int64(wc.Names))
					continue
				}
				sets[i] = set
				// Every loss is counted as it happens: Lost is buffered (64)
				// and drops reports beyond that.
				go func() {
					for l := range set.Lost() {
						switch {
						case errors.Is(l.Err, leasecore.ErrLocalDeadline):
							lostDL.Add(1)
						case errors.Is(l.Err, leasecore.ErrLost):
							lostSrv.Add(1)
						default:
							lostOther.Add(1)
						}
					}
				}()
				names := make([]string, wc.Names)
				for n := range names {
					names[n] = leaseName(h, n)
				}
				got, r, err := acquireAllRetry(setupCtx, set, names)
				retries.Add(int64(r))
				acquired.Add(int64(got))
				if err != nil {
					acqErrs.Add(int64(len(names) - got))
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	for i := range wc.Count {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	ready := workerMsg{Kind: "ready", SetupSeconds: time.Since(start).Seconds(), Acquired: int(acquired.Load()),
		AcquireErrors: int(acqErrs.Load()), Retries: int(retries.Load())}
	if s, ok := firstErr.Load().(string); ok {
		ready.FirstError = s
	}
	if err := out.Encode(ready); err != nil {
		return 1
	}

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "go":
			rec.begin()
			continue
		case "stop":
			rec.stop()
		default:
			continue
		}
		break
	}
	res := workerMsg{Kind: "result"}
	for _, set := range sets {
		if set == nil {
			continue
		}
		res.Held += len(set.Names())
	}
	time.Sleep(50 * time.Millisecond) // the counting goroutines catch up with the last reports
	res.LostDeadline, res.LostServer, res.LostOther = int(lostDL.Load()), int(lostSrv.Load()), int(lostOther.Load())
	res.Missing = wc.Count*wc.Names - res.Held
	rec.mu.Lock()
	res.WindowSeconds = rec.end.Sub(rec.start).Seconds()
	res.RenewOK, res.RenewFailed, res.NamesRenewed, res.RenewFailedTotal = rec.ok, rec.failed, rec.names, rec.failedTotal
	res.LatencyMicros, res.FirstFailure = rec.lat, rec.firstFail
	rec.mu.Unlock()
	if err := out.Encode(res); err != nil {
		return 1
	}
	return 0
}
