// Package timeline draws a case's recorded events (conformance.TimelineEvent)
// as an SVG picture: one lane per actor, events left to right in the order
// they happened, so a reader sees at a glance where A froze, when the lease
// expired, when B wrote, and what happened to A's write.
//
// Columns follow the order of events, not a linear time scale: F4's
// interesting part (B's whole life) takes about 100 ms of a 5 s run and
// would be a smudge on a linear axis. Every event carries its time, and
// periodic background renewals are drawn as ticks between the columns at
// their interpolated times.
package timeline

import (
	"fmt"
	"html"
	"io"
	"strings"
	"time"

	"github.com/leasefence/leasefence/conformance"
)

// lanes in drawing order, with their titles.
var lanes = []struct{ id, title string }{
	{"parent", "parent (driver)"},
	{"A", "holder A (process)"},
	{"lease", "lease database"},
	{"B", "holder B (process)"},
	{"resource", "resource database"},
}

const (
	width      = 1200.0
	left       = 160.0 // lane titles
	right      = 20.0
	laneHeight = 62.0
	lineHeight = 17.0
)

// WriteSVG draws events (in time order) with title above.
func WriteSVG(w io.Writer, title string, events []conformance.TimelineEvent) error {
	laneIndex := map[string]int{}
	for i, l := range lanes {
		laneIndex[l.id] = i
	}
	var keys []int  // events that get a column and a number
	var ticks []int // periodic renewals: ticks between columns
	for i, e := range events {
		if _, ok := laneIndex[e.Lane]; !ok {
			continue
		}
		if strings.HasPrefix(e.Text, "RENEWED ok=true") {
			ticks = append(ticks, i)
		} else {
			keys = append(keys, i)
		}
	}
	summary := headline(events)
	top := 62.0 + float64(len(summary))*lineHeight + 10
	chartBottom := top + float64(len(lanes))*laneHeight
	listTop := chartBottom + 34
	listRows := (len(keys) + 1) / 2
	height := listTop + float64(listRows)*lineHeight + 20

	colW := (width - left - right) / float64(max(len(keys), 1))
	colX := func(k int) float64 { return left + (float64(k)+0.5)*colW }
	laneY := func(lane string) float64 { return top + (float64(laneIndex[lane])+0.5)*laneHeight }
	// xAt places a time between the columns around it.
	xAt := func(t time.Duration) float64 {
		for k := range keys {
			if events[keys[k]].At >= t {
				if k == 0 {
					return colX(0) - colW/2
				}
				t0, t1 := events[keys[k-1]].At, events[keys[k]].At
				f := 0.5
				if t1 > t0 {
					f = float64(t-t0) / float64(t1-t0)
				}
				return colX(k-1) + f*colW
			}
		}
		return width - right
	}
	keyX := map[int]float64{} // event index -> x
	for k, i := range keys {
		keyX[i] = colX(k)
	}

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="DejaVu Sans, Arial, sans-serif">`+"\n",
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="16" y="26" font-size="17" font-weight="bold">%s</text>`+"\n", esc(title))
	p(`<text x="16" y="46" font-size="12" fill="#555">drawn from the events this run recorded; times since the case started; columns in event order (not to scale)</text>` + "\n")
	for i, s := range summary {
		p(`<text x="16" y="%.0f" font-size="13" fill="%s" font-weight="bold">%s</text>`+"\n", 66+float64(i)*lineHeight, colorOf(s), esc(s))
	}

	for _, l := range lanes {
		y := laneY(l.id)
		p(`<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ccc"/>`+"\n", left, y, width-right, y)
		p(`<text x="12" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", y+4, esc(l.title))
	}

	// Intervals: A frozen (SIGSTOP..SIGCONT), each lease holding period.
	span := func(lane string, from, to float64, fill, label string) {
		y := laneY(lane) - 11
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="22" rx="3" fill="%s" opacity="0.30"/>`+"\n", from, y, max(to-from, 2), fill)
		p(`<text x="%.1f" y="%.1f" font-size="11" fill="#222">%s</text>`+"\n", from+14, y-3, esc(label))
	}
	interval := func(lane, from, to, fill, label string) {
		i, ok := findIdx(events, lane, from)
		if !ok {
			return
		}
		x0, x1 := keyX[i], width-right
		if j, ok := findIdx(events, lane, to); ok {
			x1 = keyX[j]
		}
		span(lane, x0, x1, fill, label)
	}
	interval("A", "SIGSTOP", "SIGCONT", "#7b3fbf", "A frozen by SIGSTOP: its renewals stop too")
	interval("lease", "holder-a", "expires", "#1f77b4", "held by holder-a (token 1 period)")
	interval("lease", "holder-b", "released", "#ff7f0e", "held by holder-b")

	for _, i := range ticks {
		e := events[i]
		x, y := xAt(e.At), laneY(e.Lane)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#2ca02c" stroke-width="2"><title>%s %s</title></line>`+"\n",
			x, y-7, x, y+7, fmtDur(e.At), esc(e.Text))
	}
	if len(ticks) > 0 {
		e := events[ticks[0]]
		p(`<text x="%.1f" y="%.1f" font-size="10" fill="#2ca02c">| background renewal (%d)</text>`+"\n", xAt(e.At), laneY(e.Lane)+22, len(ticks))
	}
	for k, i := range keys {
		e := events[i]
		x, y := keyX[i], laneY(e.Lane)
		c := laneColor(e.Lane, e.Text)
		p(`<circle cx="%.1f" cy="%.1f" r="9" fill="%s"><title>%s %s</title></circle>`+"\n", x, y, c, fmtDur(e.At), esc(e.Text))
		p(`<text x="%.1f" y="%.1f" font-size="10" fill="white" text-anchor="middle" font-weight="bold">%d</text>`+"\n", x, y+3.5, k+1)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x, chartBottom, x, chartBottom+6)
		p(`<text x="%.1f" y="%.1f" font-size="9" fill="#777" text-anchor="middle">%s</text>`+"\n", x, chartBottom+16, fmtDur(e.At))
	}

	// The numbered list of what happened.
	colWidth := (width - 32) / 2
	for k, i := range keys {
		e := events[i]
		col, row := k/listRows, k%listRows
		x, y := 16+float64(col)*colWidth, listTop+float64(row)*lineHeight
		p(`<text x="%.1f" y="%.1f" font-size="11" fill="%s"><tspan font-weight="bold">%d.</tspan> %s  %s: %s</text>`+"\n",
			x, y, laneColor(e.Lane, e.Text), k+1, fmtDur(e.At), esc(e.Lane), esc(e.Text))
	}
	p("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// headline says in a few lines where A froze, when the lease expired, when
// B wrote, and what became of A's write, from the recorded events.
func headline(events []conformance.TimelineEvent) []string {
	var out []string
	at := func(lane, s string) (time.Duration, string, bool) {
		i, ok := findIdx(events, lane, s)
		if !ok {
			return 0, "", false
		}
		return events[i].At, events[i].Text, true
	}
	if stop, _, ok := at("A", "SIGSTOP"); ok {
		line := fmt.Sprintf("A frozen at %s", fmtDur(stop))
		if cont, _, ok := at("A", "SIGCONT"); ok {
			line += fmt.Sprintf(", thawed at %s", fmtDur(cont))
		}
		out = append(out, line)
	}
	if exp, _, ok := at("lease", "expires"); ok {
		out = append(out, fmt.Sprintf("A's lease expired by the database clock at %s", fmtDur(exp)))
	}
	if t, text, ok := at("resource", "B's"); ok {
		out = append(out, fmt.Sprintf("B wrote at %s: %s", fmtDur(t), text))
	}
	if t, text, ok := at("resource", "A's"); ok {
		out = append(out, fmt.Sprintf("A wrote at %s: %s", fmtDur(t), text))
	}
	return out
}

// findIdx returns the index of the first event on lane whose text contains s.
func findIdx(events []conformance.TimelineEvent, lane, s string) (int, bool) {
	for i, e := range events {
		if e.Lane == lane && strings.Contains(e.Text, s) {
			return i, true
		}
	}
	return 0, false
}

// colorOf picks a colour that says what kind of event it is.
func colorOf(text string) string { return laneColor("", text) }

// laneColor is colorOf knowing the lane: A writes only after it was frozen
// and its lease moved on, so any write of A that is accepted is stale.
func laneColor(lane, text string) string {
	switch {
	case lane == "A" && strings.Contains(text, "WRITE accepted=true"):
		return "#c62828"
	case strings.Contains(text, "rejected"), strings.Contains(text, "accepted=false"), strings.Contains(text, "ok=false"):
		return "#c62828" // refused
	case strings.Contains(text, "A's token") && strings.Contains(text, "accepted"),
		strings.Contains(text, "A wrote") && strings.Contains(text, "accepted"):
		return "#c62828" // a stale write landed
	case strings.Contains(text, "accepted"), strings.Contains(text, "ACQUIRED"), strings.Contains(text, "issued"),
		strings.Contains(text, "ok=true"):
		return "#2e7d32"
	case strings.Contains(text, "SIGSTOP"), strings.Contains(text, "SIGCONT"), strings.Contains(text, "frozen"),
		strings.Contains(text, "expire"):
		return "#6a1b9a"
	}
	return "#555"
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

func esc(s string) string { return html.EscapeString(s) }
