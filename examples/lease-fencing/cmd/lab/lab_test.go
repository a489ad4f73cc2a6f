package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
)

// TestWriteConfigMergesServerSets: cases that two server sets ran, in
// whatever order they finished, go to the output file in the suite's
// order, each after the line naming its set, under one header naming both
// sets and one SUMMARY with the sums; a case no set ran fails the run and
// is named. With one set the file has the lab's usual form: no set lines.
func TestWriteConfigMergesServerSets(t *testing.T) {
	cfg := config{name: "pgx", output: "out.txt", title: "PostgreSQL"}
	caseOut := func(set int, id string, passed, failed int) caseOutput {
		text := "CASE " + id + " :: " + id + "\n  ok   [I1] " + id + " (expected=x, actual=x)\n"
		return caseOutput{set: set, text: []byte(text),
			res: conformance.CaseResult{ID: id, Name: id, Passed: passed, Failed: failed}}
	}
	l := &lab{outDir: t.TempDir(), progress: io.Discard}
	started := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

	r := &configRun{cfg: cfg, ids: []string{"F1", "F2", "F3"},
		cases: []caseOutput{caseOut(1, "F1", 1, 0), caseOut(0, "F2", 2, 1), caseOut(1, "F3", 3, 0)},
		where: []string{"PostgreSQL on 127.0.0.1:1", "PostgreSQL on 127.0.0.1:2"}}
	row, err := l.writeConfig(r, started)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(l.outDir, "out.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := "# leasefence lab: PostgreSQL\n" +
		"# 2 server sets, each case run on one from its beginning to its end: set 1: PostgreSQL on 127.0.0.1:1; set 2: PostgreSQL on 127.0.0.1:2; "
	if !strings.HasPrefix(string(got), want) {
		t.Errorf("header:\n%s\nwant prefix:\n%s", got, want)
	}
	body := string(got[strings.Index(string(got), "\n# server set"):])
	wantBody := "\n# server set 2\nCASE F1 :: F1\n  ok   [I1] F1 (expected=x, actual=x)\n" +
		"# server set 1\nCASE F2 :: F2\n  ok   [I1] F2 (expected=x, actual=x)\n" +
		"# server set 2\nCASE F3 :: F3\n  ok   [I1] F3 (expected=x, actual=x)\n" +
		"SUMMARY passed=6 failed=1\n"
	if body != wantBody {
		t.Errorf("body:\n%s\nwant:\n%s", body, wantBody)
	}
	if row.Passed != 6 || row.Failed != 1 {
		t.Errorf("row passed=%d failed=%d, want 6 and 1", row.Passed, row.Failed)
	}

	// One set: no set lines; a case that did not run is an error.
	r = &configRun{cfg: cfg, ids: []string{"F1", "F2"},
		cases: []caseOutput{caseOut(0, "F1", 1, 0), {}},
		where: []string{"PostgreSQL on 127.0.0.1:1"}}
	if _, err := l.writeConfig(r, started); err == nil || !strings.Contains(err.Error(), "cases not run: F2") {
		t.Errorf("a case no set ran: err = %v, want one naming F2", err)
	}
	got, _ = os.ReadFile(filepath.Join(l.outDir, "out.txt"))
	if strings.Contains(string(got), "server set") || !strings.HasPrefix(string(got), "# leasefence lab: PostgreSQL\n# PostgreSQL on 127.0.0.1:1; ") {
		t.Errorf("one set's file:\n%s", got)
	}
}
