package torture

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/anishathalye/porcupine"
)

// savedHistory is history.json of a history with violations.
type savedHistory struct {
	Run        string        `json:"run"`
	Flavor     flavor        `json:"flavor"`
	Seed       uint64        `json:"seed"`
	History    int           `json:"history"`
	Replay     string        `json:"replay"`
	Schedule   []string      `json:"schedule"`
	Faults     []faultRecord `json:"faults"`
	Verdict    string        `json:"linearizability"`
	Violations []violation   `json:"violations"`
	Ops        []*Op         `json:"ops"`
	Clock      string        `json:"clock"`
	Model      string        `json:"model"`
}

// saveEvidence writes a violating history to a directory of its own under
// cfg.evidenceDir: history.json (every operation with its times, the
// schedule, the faults as injected, the violations), linearizability.html
// (porcupine's visualization, with the acquires and the faults as
// annotations), seed.txt (how to replay it) and violations.txt. It returns
// the directory.
func saveEvidence(cfg runConfig, idx int, plan []plannedFault, ops []*Op, frs []faultRecord, res checkResult) (string, error) {
	base := cfg.slug
	if base == "" {
		base = slug(cfg.name)
	}
	name := fmt.Sprintf("%s-seed%d-h%d", base, cfg.seed, idx)
	if cfg.keepOne {
		// A control keeps one example, in a directory of a fixed name that
		// the next run replaces.
		name = base
	}
	dir := filepath.Join(cfg.evidenceDir, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	replay := fmt.Sprintf("%s -torture.only=%d", cfg.replay, idx)
	var schedule []string
	for _, f := range plan {
		schedule = append(schedule, f.String())
	}
	h := savedHistory{Run: cfg.name, Flavor: cfg.flavor, Seed: cfg.seed, History: idx, Replay: replay,
		Schedule: schedule, Faults: frs, Verdict: string(res.lin), Violations: res.violations, Ops: ops,
		Clock: "CLOCK_MONOTONIC nanoseconds, one clock for every process; return 0: never returned",
		Model: "the fenced register: floor + one cell per part (see docs/torture.md)"}
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "history.json"), b, 0o644); err != nil {
		return "", err
	}
	info := res.linInfo
	info.AddAnnotations(annotations(ops, frs))
	if err := porcupine.VisualizePath(registerModelFor(cfg.noFloor), info, filepath.Join(dir, "linearizability.html")); err != nil {
		return "", err
	}
	seed := fmt.Sprintf("run %s, seed %d, history %d\nreplay (from torture/): go test -count=1 -run 'TestTorture' %s\n"+
		"The seed replays the nemesis's schedule (which faults, when, how long, at whom) and the holders' choices;\n"+
		"the timing of real processes and servers does not replay.\n", cfg.name, cfg.seed, idx, replay)
	if err := os.WriteFile(filepath.Join(dir, "seed.txt"), []byte(seed), 0o644); err != nil {
		return "", err
	}
	var vs strings.Builder
	for _, v := range res.violations {
		fmt.Fprintln(&vs, v)
	}
	if err := os.WriteFile(filepath.Join(dir, "violations.txt"), []byte(vs.String()), 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// slug makes a run's name a directory name.
func slug(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, s)
}
