package command

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// writeJSON writes v as indented JSON, one document per command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns; cells are never empty ("-" instead), so
// that scripts splitting on whitespace keep the columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// tokenText shows a token, "-" for none.
func tokenText(t leasecore.Token) string {
	if t == 0 {
		return "-"
	}
	return t.String()
}

// leftText shows a remaining time rounded to milliseconds.
func leftText(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

// leaseState names a lease's state as the manual does.
func leaseState(kind string, st leasecore.LeaseState) string {
	switch {
	case st.Held:
		return "held"
	case !st.Exists && kind == backendEtcd:
		return "free" // etcd keeps no record of a released or expired lease
	case !st.Exists:
		return "never-acquired"
	case st.Released:
		return "released"
	}
	return "expired"
}

// leaseJSON is a lease in --json output.
type leaseJSON struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Exists      bool   `json:"exists"`
	Held        bool   `json:"held"`
	Released    bool   `json:"released"`
	Holder      string `json:"holder"`
	Token       uint64 `json:"token"`
	RemainingMS int64  `json:"remaining_ms"`
}

func toLeaseJSON(kind string, st leasecore.LeaseState) leaseJSON {
	return leaseJSON{Name: st.Name, State: leaseState(kind, st), Exists: st.Exists, Held: st.Held,
		Released: st.Released, Holder: st.Holder, Token: uint64(st.Token), RemainingMS: st.Remaining.Milliseconds()}
}

// attemptJSON is an attempt-log entry in --json output.
type attemptJSON struct {
	At       time.Time `json:"at"`
	Scope    string    `json:"scope"`
	Part     string    `json:"part"`
	Writer   string    `json:"writer"`
	Token    uint64    `json:"token"`
	Accepted bool      `json:"accepted"`
	Floor    uint64    `json:"floor"`
}
