package conformance

import "context"

// caseF15 is being written.
func caseF15(ctx context.Context, c *caseRun, h Harness) {
	c.Skip("F15: not written yet")
}
