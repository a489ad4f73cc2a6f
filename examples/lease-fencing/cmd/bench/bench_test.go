package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// TestMain doubles as the bench's etcd server process.
func TestMain(m *testing.M) {
	if etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	os.Exit(m.Run())
}

// TestBenchRuns runs the whole bench once with one iteration per variant,
// so the benchmark code cannot rot: every variant must run without error
// and every ratio line must be printed. It checks no timing.
func TestBenchRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and etcd servers")
	}
	if err := flag.Set("test.benchtime", "2x"); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(t.Context(), config{stdout: &out, rounds: 1, scaling: "1,10", handoffSamples: 2, handoffPollSamples: 1, handoffMembers: defaultHandoffMembers}); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"RATIO fenced_write/unfenced_upsert ",
		"RATIO user_tx_fenced/user_tx_unfenced ",
		"RATIO pipeline_fenced/unfenced_upsert ",
		"RATIO article_txn_fence/unfenced_upsert ",
		"RATIO batch2_per_part/unfenced_upsert ",
		"RATIO acquire/unfenced_upsert ",
		"RATIO renew/unfenced_upsert ",
		"RATIO renew_1000_leases_per_lease/renew ",
		"RATIO fenced_8_scopes_8_clients/unfenced_8_clients ",
		"RATIO fenced_1_scope_8_clients/unfenced_8_clients ",
		"RATIO fenced_64_scopes_64_clients/unfenced_64_clients ",
		"RATIO pipeline_fenced_64_scopes_64_clients/unfenced_64_clients ",
		"RATIO etcd_guarded_txn/etcd_put ",
		"RATIO etcd_fenced_write/etcd_put ",
		"RATIO etcd_acquire_release/etcd_mutex_lock_unlock ",
		"RATIO fenced_write/fenced_write_limit ",
		"RATIO user_tx_fenced/user_tx_limit ",
		"RATIO user_tx_fenced/user_tx_fenced_no_idle ",
		"RATIO user_tx_fenced_no_idle/user_tx_limit ",
		"RATIO pipeline_fenced/pipeline_limit ",
		"RATIO pipeline_limit_guard/pipeline_limit ",
		"RATIO pipeline_fenced/pipeline_limit_guard ",
		"RATIO fenced_8_scopes_8_clients/limit_8_scopes_8_clients ",
		"RATIO etcd_fenced_write/etcd_limit ",
		"RATIO etcd_acquire_release/etcd_acquire_release_limit ",
		"compares time per write: above 1, the fence costs more",
		"RATIO handoff_p50_etcd_campaign/etcd_election ",
		"RATIO handoff_p50_etcd_campaign_shared/etcd_election ",
		"RATIO handoff_p50_pg_campaign/poll_2s ",
		"RATIO handoff_p50_ms_pg_campaign ",
		"# commit cost: durable single-row upsert ",
		"# handoff goals: pg_campaign p50 ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	// The commit cost is a comment for the reader, not a goal.
	if strings.Contains(out.String(), "RATIO "+commitCostRatio) {
		t.Errorf("the commit cost is printed as a RATIO line:\n%s", out.String())
	}
	// Every handoff variant has a table row with its samples (2, the
	// poller 1) and no Campaign retries, and the p99s are in the table
	// only, not RATIO lines.
	for _, row := range []string{"pg_campaign", "poll_2s", "etcd_campaign", "etcd_campaign_shared", "etcd_election"} {
		samples, retries := "2", "0"
		switch row {
		case "poll_2s":
			samples = "1"
		case "etcd_election":
			retries = "-"
		}
		found := false
		for line := range strings.Lines(out.String()) {
			// handoff p50 p99 min max samples retries
			if f := strings.Fields(line); len(f) == 7 && f[0] == row && f[5] == samples && f[6] == retries {
				found = true
			}
		}
		if !found {
			t.Errorf("no handoff row %s with %s samples and retries %s:\n%s", row, samples, retries, out.String())
		}
	}
	if strings.Contains(out.String(), "RATIO handoff_p99") {
		t.Errorf("a handoff p99 is printed as a RATIO line:\n%s", out.String())
	}
	// Every limit variant has a row in the table (name, median, min, max,
	// runs, allocs, bytes), measured in the one round: once per ratio it
	// is in (user_tx_limit: RunTx with and without its idle timeout).
	for name, runs := range map[string]string{"fenced_write_limit": "1", "user_tx_limit": "2", "pipeline_limit": "2", "pipeline_limit_guard": "2",
		"limit_8_scopes_8_clients": "1", "etcd_limit": "1", "etcd_acquire_release_limit": "1"} {
		found := false
		for line := range strings.Lines(out.String()) {
			if f := strings.Fields(line); len(f) == 7 && f[0] == name && f[4] == runs {
				found = true
			}
		}
		if !found {
			t.Errorf("no table row %s with %s run(s):\n%s", name, runs, out.String())
		}
	}
}

// TestLimitRatios: every fenced path's limit ratio puts the fenced variant
// over its limit variant, the 8-client one too (time per write, not
// throughput), and every limit variant is in exactly one ratio, so it is
// measured in the rounds of its fenced variant only — user_tx_limit in two,
// RunTx's with and without its idle timeout, both fenced variants over it;
// pipeline_limit in two, under the fenced pipeline and under the limit
// that can abort it (pipeline_limit_guard).
func TestLimitRatios(t *testing.T) {
	want := map[string]string{
		"fenced_write":              "fenced_write_limit",
		"user_tx_fenced":            "user_tx_limit",
		"pipeline_fenced":           "pipeline_limit",
		"fenced_8_scopes_8_clients": "limit_8_scopes_8_clients",
		"etcd_fenced_write":         "etcd_limit",
		"etcd_acquire_release":      "etcd_acquire_release_limit",
	}
	uses := map[string]int{}
	for _, r := range ratios {
		uses[r.num]++
		uses[r.den]++
		if den, ok := want[r.num]; ok && r.den == den {
			if r.name != r.num+"/"+r.den || r.info {
				t.Errorf("ratio %+v: want name %s/%s, a RATIO line", r, r.num, r.den)
			}
			delete(want, r.num)
		}
	}
	for num, den := range want {
		t.Errorf("no ratio %s/%s with %s as num", num, den, num)
	}
	for den, n := range map[string]int{"fenced_write_limit": 1, "user_tx_limit": 2, "pipeline_limit": 2, "limit_8_scopes_8_clients": 1, "etcd_limit": 1,
		"etcd_acquire_release_limit": 1} {
		if uses[den] != n {
			t.Errorf("%s is in %d ratios, want %d", den, uses[den], n)
		}
	}
	for _, r := range ratios {
		if r.den == "user_tx_limit" && !strings.HasPrefix(r.num, "user_tx_fenced") {
			t.Errorf("ratio %s: user_tx_limit under %s, want a fenced RunTx", r.name, r.num)
		}
	}
}

func TestPercentile(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100 .. 1
	}
	for _, tc := range []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{nil, 0.99, 0},
		{[]float64{7}, 0.99, 7},
		{xs, 0.99, 99},
		{xs, 0.5, 50},
		{xs[:10], 0.99, 100}, // below 100 samples: the largest
	} {
		if got := percentile(tc.xs, tc.p); got != tc.want {
			t.Errorf("percentile(%d samples, %v) = %v, want %v", len(tc.xs), tc.p, got, tc.want)
		}
	}
}

// TestPollTurn: the poller takes exactly pollSamples of the turns, spread
// over them.
func TestPollTurn(t *testing.T) {
	for _, tc := range []struct{ samples, poll int }{{100, 10}, {2, 1}, {7, 7}, {10, 3}} {
		var turns []int
		for turn := 1; turn <= tc.samples; turn++ {
			if pollTurn(turn, tc.samples, tc.poll) {
				turns = append(turns, turn)
			}
		}
		if len(turns) != tc.poll {
			t.Errorf("%d samples, %d poll samples: poll turns %v", tc.samples, tc.poll, turns)
		}
		if tc.samples == 100 && (turns[0] != 10 || turns[9] != 100) {
			t.Errorf("poll turns %v, want every 10th", turns)
		}
	}
}

func TestQuartiles(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want [5]float64
	}{
		{nil, [5]float64{}},
		{[]float64{3}, [5]float64{3, 3, 3, 3, 3}},
		{[]float64{4, 1, 3, 2}, [5]float64{1, 1.5, 2.5, 3.5, 4}},
		{[]float64{5, 1, 4, 2, 3}, [5]float64{1, 1.5, 3, 4.5, 5}},
	} {
		if got := quartiles(tc.xs); got != tc.want {
			t.Errorf("quartiles(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

// TestRoundUnits: every ratio is one unit, and every variant in no ratio
// is a unit of its own; a variant in a ratio is not measured alone.
func TestRoundUnits(t *testing.T) {
	vs := []variant{{name: "a"}, {name: "b"}, {name: "c"}, {name: "lonely"}}
	rs := []ratio{{name: "a/b", num: "a", den: "b"}, {name: "c/b", num: "c", den: "b", info: true}}
	us := roundUnits(vs, rs)
	if len(us) != 3 || us[0].ratio != &rs[0] || us[1].ratio != &rs[1] || us[2].variant != "lonely" {
		t.Fatalf("units %+v", us)
	}
}
