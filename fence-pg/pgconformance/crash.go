package pgconformance

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// CrashRestart implements conformance.CrashRestarter with
// pgtemp.RestartImmediate on Config.Cluster. What it says about recovery
// comes from the server's own log of the restart, not from what an
// immediate shutdown is expected to cause.
func (h *harness) CrashRestart(ctx context.Context) (string, time.Duration, error) {
	if h.cfg.Cluster == nil {
		return "", 0, fmt.Errorf("%s: crash restart: Config.Cluster is not set", pkg)
	}
	logPath := ""
	if dir := h.cfg.Cluster.DataDir(); dir != "" {
		logPath = filepath.Join(filepath.Dir(dir), "postgres.log") // pgtemp: next to the data directory
	}
	offset := logSize(logPath)
	down, err := h.cfg.Cluster.RestartImmediate(ctx)
	if err != nil {
		return "", 0, err
	}
	return "SIGQUIT to the postmaster (immediate shutdown, no checkpoint), restart on the same data directory; " +
		recoveryEvidence(logSince(logPath, offset)), down, nil
}

var (
	reInterrupted = regexp.MustCompile(`database system was (interrupted|not properly shut down)[^\n]*`)
	reRedoStart   = regexp.MustCompile(`redo starts at (\S+)`)
	reRedoDone    = regexp.MustCompile(`redo done at (\S+)`)
	reNoRedo      = regexp.MustCompile(`redo is not required`)
)

// recoveryEvidence says what the server's log of a restart shows about
// WAL recovery, quoting its lines: the crash it noticed and the redo it
// ran (start and end positions), or that it shows none.
func recoveryEvidence(log string) string {
	var seen []string
	if m := reInterrupted.FindString(log); m != "" {
		seen = append(seen, strconv.Quote(strings.TrimSpace(m)))
	}
	start, done := reRedoStart.FindStringSubmatch(log), reRedoDone.FindStringSubmatch(log)
	switch {
	case start != nil && done != nil:
		seen = append(seen, strconv.Quote(start[0]), strconv.Quote(done[0]))
		return "the server's log: " + strings.Join(seen, ", ") + ": recovery replayed the WAL from " + start[1] + " to " + done[1]
	case reNoRedo.MatchString(log):
		seen = append(seen, `"redo is not required"`)
		return "the server's log: " + strings.Join(seen, ", ") + ": no WAL was replayed"
	case log == "":
		return "the server's log was not readable: nothing is claimed about WAL recovery"
	}
	return "the server's log shows no WAL redo"
}

func logSize(path string) int64 {
	if path == "" {
		return 0
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSince returns the log from offset on ("" when it cannot be read).
func logSince(path string, offset int64) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<40))
	if err != nil {
		return ""
	}
	return string(b)
}
