package pgconformance

import (
	"strings"
	"testing"
)

// F8's crash note reports recovery only when the server's log of the
// restart shows it, and says so when it does not.
func TestRecoveryEvidence(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      []string
		lack      string
	}{
		{"redo", "LOG:  database system was interrupted; last known up at 2026-12-02 16:32:40 UTC\n" +
			"LOG:  database system was not properly shut down; automatic recovery in progress\n" +
			"LOG:  redo starts at 0/1A2B3C8\nLOG:  redo done at 0/1A4F000 system usage: CPU: user: 0.00 s\n",
			[]string{`"database system was interrupted; last known up at 2026-12-02 16:32:40 UTC"`, `"redo starts at 0/1A2B3C8"`,
				`"redo done at 0/1A4F000"`, "recovery replayed the WAL from 0/1A2B3C8 to 0/1A4F000"}, ""},
		{"clean start", "LOG:  database system was shut down at 2026-12-02 16:32:40 UTC\nLOG:  database system is ready to accept connections\n",
			[]string{"the server's log shows no WAL redo"}, "replayed"},
		{"no redo needed", "LOG:  database system was not properly shut down; automatic recovery in progress\nLOG:  redo is not required\n",
			[]string{`"redo is not required"`, "no WAL was replayed"}, "replayed the WAL"},
		{"unreadable", "", []string{"nothing is claimed about WAL recovery"}, "replayed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := recoveryEvidence(tc.log)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("recoveryEvidence = %q, lacks %q", got, w)
				}
			}
			if tc.lack != "" && strings.Contains(got, tc.lack) {
				t.Errorf("recoveryEvidence = %q, has %q", got, tc.lack)
			}
		})
	}
}
