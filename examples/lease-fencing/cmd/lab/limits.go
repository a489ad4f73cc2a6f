package main

import (
	_ "embed"
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
// lines its run printed.
type limitsRow struct {
	Name, Downtime, Remaining, ExpiryAfterStop string
	Passed, Failed                             int
}

var (
	reDowntime  = regexp.MustCompile(`down for (\S+)`)
	reRemaining = regexp.MustCompile(`held=\w+ with (\S+) left`)
	reExpiry    = regexp.MustCompile(`expired by the backend's clock (\S+) after SIGSTOP`)
)

func newLimitsRow(name, output string, passed, failed int) limitsRow {
	find := func(re *regexp.Regexp) string {
		if m := re.FindStringSubmatch(output); m != nil {
			return m[1]
		}
		return "(not run)"
	}
	return limitsRow{Name: name, Passed: passed, Failed: failed,
		Downtime: find(reDowntime), Remaining: find(reRemaining), ExpiryAfterStop: find(reExpiry)}
}

// writeLimits writes LIMITS.md from the template and the run's figures.
func (l *lab) writeLimits(pgVersion string, rows []limitsRow) error {
	if len(rows) == 0 {
		return nil
	}
	var names []string
	for _, r := range rows {
		names = append(names, r.Name)
	}
	byName := map[string]limitsRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	t, err := template.New("limits").Parse(limitsTemplate)
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(l.outDir, "LIMITS.md"))
	if err != nil {
		return err
	}
	err = t.Execute(f, map[string]any{
		"Date":      time.Now().UTC().Format(time.RFC3339),
		"PGVersion": pgVersion,
		"GoVersion": runtime.Version(),
		"CPUs":      runtime.NumCPU(),
		"Configs":   strings.Join(names, ", "),
		"ByName":    byName,
		"Rows":      rows,
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
