package torture

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// The defaults are the short run that `make test` includes; `make torture`
// passes the long one's.
var (
	flagHistories = flag.Int("torture.histories", 3, "histories of the fence per backend (make torture: 200)")
	flagControls  = flag.Int("torture.controls", 3, "histories of each negative control")
	flagLanes     = flag.Int("torture.lanes", 2, "histories run side by side per backend, each with its own lease and holders")
	flagSeed      = flag.Uint64("torture.seed", 0, "the run's seed (0: pick one; it is printed)")
	flagOnly      = flag.Int("torture.only", -1, "run only this history of each run: a replay with -torture.seed")
	flagBackends  = flag.String("torture.backends", "pg,etcd,etcd-cluster,pg-patroni",
		"comma-separated: pg, etcd, etcd-cluster (3 members), pg-patroni (3 PostgreSQL members under Patroni)")
	flagEvidence = flag.String("torture.evidence", filepath.Join("..", "evidence", "torture"),
		"where every history of the fence with a violation is saved")
	flagControlEvidence = flag.String("torture.control-evidence", "",
		"where one violating history of each negative control is saved (empty: a temporary directory)")
	flagReport = flag.String("torture.report", "", "also write the figures to this file")
)

// TestMain doubles as the etcd server (etcdtemp re-executes this binary)
// and as the holder processes (the runner re-executes it with holderEnv).
func TestMain(m *testing.M) {
	if etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	if IsHolderProcess() {
		os.Exit(HolderMain())
	}
	os.Exit(m.Run())
}

// TestTorture is the torture run: per backend, the fence's histories
// (no violation allowed), then the negative controls (each must be
// caught), with the figures in the log.
func TestTorture(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and etcd servers")
	}
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64N(1 << 53) // printable exactly as a JSON number too
	}
	t.Logf("torture seed %d: replay with -torture.seed=%d", seed, seed)
	controlEvidence := *flagControlEvidence
	if controlEvidence == "" {
		controlEvidence = t.TempDir()
	}
	var report *os.File
	if *flagReport != "" {
		if err := os.MkdirAll(filepath.Dir(*flagReport), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if report, err = os.Create(*flagReport); err != nil {
			t.Fatal(err)
		}
		defer report.Close()
		fmt.Fprintf(report, "torture run of %s, seed %d: %d histories per backend, %d per negative control, %d lanes\n",
			time.Now().UTC().Format(time.DateOnly), seed, *flagHistories, *flagControls, *flagLanes)
	}
	for _, backend := range strings.Split(*flagBackends, ",") {
		t.Run(backend, func(t *testing.T) {
			t0 := time.Now()
			rep := RunSuite(t.Context(), backend, SuiteOptions{
				Histories: *flagHistories, ControlHistories: *flagControls, Lanes: *flagLanes,
				Seed: seed, Only: *flagOnly, EvidenceDir: *flagEvidence, ControlEvidenceDir: controlEvidence,
				Replay:     fmt.Sprintf("-torture.backends=%s -torture.seed=%d", backend, seed),
				HolderArgs: []string{"-test.run=^$"},
				Logf:       t.Logf,
			})
			for _, l := range rep.Lines {
				t.Log(l)
				if report != nil {
					fmt.Fprintln(report, l)
				}
			}
			for _, p := range rep.Problems {
				t.Error(p)
			}
			// Proof that the checkers can fail, and that a failure leaves
			// what it takes to see why: every control saved a history with
			// porcupine's visualization.
			for name, dir := range rep.ControlEvidence {
				for _, f := range []string{"history.json", "linearizability.html", "seed.txt", "violations.txt"} {
					if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
						t.Errorf("%s: the saved evidence lacks %s: %v", name, f, err)
					}
				}
			}
			took := fmt.Sprintf("%s: torture took %v, %d problems", backend, time.Since(t0).Round(time.Second), len(rep.Problems))
			t.Log(took)
			if report != nil {
				fmt.Fprintln(report, took)
				for _, p := range rep.Problems {
					fmt.Fprintln(report, "PROBLEM:", p)
				}
			}
		})
	}
}
