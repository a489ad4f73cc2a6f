package timeline

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
)

func TestWriteSVGShowsTheTimeline(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	events := []conformance.TimelineEvent{
		{At: ms(10), Lane: "A", Text: "ACQUIRED token=1"},
		{At: ms(12), Lane: "lease", Text: "token 1 issued to holder-a"},
		{At: ms(3100), Lane: "A", Text: "SIGSTOP: frozen after its check, before its write"},
		{At: ms(4300), Lane: "lease", Text: "A's lease expires (backend clock)"},
		{At: ms(4400), Lane: "lease", Text: "token 2 issued to holder-b"},
		{At: ms(4450), Lane: "resource", Text: "B's token-2 write accepted, floor 0->2"},
		{At: ms(4500), Lane: "lease", Text: "released by holder-b"},
		{At: ms(4600), Lane: "A", Text: "SIGCONT: resumes with its write"},
		{At: ms(4610), Lane: "A", Text: "WRITE accepted=false token=1 floor=2"},
		{At: ms(4611), Lane: "resource", Text: "A's token-1 write rejected (floor 2)"},
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, "F4 <fenced>", events); err != nil {
		t.Fatal(err)
	}
	svg := buf.String()
	for _, want := range []string{
		"<svg ", "</svg>", "F4 &lt;fenced&gt;",
		"A frozen by SIGSTOP", "held by holder-a", "held by holder-b",
		"A frozen at 3.100s, thawed at 4.600s",
		"A&#39;s lease expired by the database clock at 4.300s",
		"A wrote at 4.611s: A&#39;s token-1 write rejected (floor 2)",
		"4.610s  A: WRITE accepted=false token=1 floor=2",
		`fill="#c62828"`, // the rejected write is drawn as refused
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// A different run draws a different picture.
	var other bytes.Buffer
	events[8].Text = "WRITE accepted=true token=1 floor=0"
	events[9].Text = "A's token-1 write accepted: summary = rows=200(A)"
	if err := WriteSVG(&other, "F4 <fenced>", events); err != nil {
		t.Fatal(err)
	}
	if other.String() == svg {
		t.Error("a changed run produced the same picture")
	}
}
