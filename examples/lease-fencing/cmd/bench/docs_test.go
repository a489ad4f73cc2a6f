package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// performanceDoc is the page `make bench` rewrites (the Makefile passes it
// as -docs).
const performanceDoc = "../../../../docs/performance.md"

// TestUpdateDocsPerformancePage: docs/performance.md carries the bench
// markers once each, and updateDocs replaces what is between them with the
// report in a code block, leaving the rest of the page as it was.
func TestUpdateDocsPerformancePage(t *testing.T) {
	const begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
	page, err := os.ReadFile(performanceDoc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	if strings.Count(s, begin) != 1 || strings.Count(s, end) != 1 || strings.Index(s, end) < strings.Index(s, begin) {
		t.Fatalf("%s: want one %s before one %s", performanceDoc, begin, end)
	}
	path := filepath.Join(t.TempDir(), "performance.md")
	if err := os.WriteFile(path, page, 0o644); err != nil {
		t.Fatal(err)
	}
	const report = "# leasefence bench, a test\nRATIO fenced_write/unfenced_upsert 1.00\n"
	if err := updateDocs(path, report); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, after := s[:strings.Index(s, begin)+len(begin)], s[strings.Index(s, end):]
	if want := before + "\n```\n" + report + "```\n" + after; string(got) != want {
		t.Errorf("updateDocs wrote\n%s\nwant\n%s", got, want)
	}
}

// TestUpdateDocsWithoutMarkers: a page without the markers is an error
// and is left alone.
func TestUpdateDocsWithoutMarkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "page.md")
	const page = "# A page\n\nno markers\n"
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := updateDocs(path, "report\n"); err == nil {
		t.Error("updateDocs accepted a page without markers")
	}
	if got, _ := os.ReadFile(path); string(got) != page {
		t.Errorf("the page changed:\n%s", got)
	}
}

// TestPerformancePageGoals: the page's Goals table names every RATIO line
// of the report (ratios), so a new ratio comes with its goal and what
// decides it.
func TestPerformancePageGoals(t *testing.T) {
	page, err := os.ReadFile(performanceDoc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	i := strings.Index(s, "\n## Goals\n")
	if i < 0 {
		t.Fatalf("%s: no Goals section", performanceDoc)
	}
	goals := s[i+1:]
	if j := strings.Index(goals, "\n## "); j >= 0 {
		goals = goals[:j]
	}
	for _, r := range ratios {
		if !r.info && !strings.Contains(goals, "`"+r.name+"`") {
			t.Errorf("%s: the Goals section does not name `%s`", performanceDoc, r.name)
		}
	}
}
