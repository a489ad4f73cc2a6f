package conformance

import "context"

// caseF14 is being written.
func caseF14(ctx context.Context, c *caseRun, h Harness) {
	c.Skip("F14: not written yet")
}
