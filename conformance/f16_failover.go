package conformance

import "context"

// caseF16 is being written.
func caseF16(ctx context.Context, c *caseRun, h Harness) {
	c.Skip("F16: not written yet")
}
