package conformance

import (
	"context"
	"fmt"
	"strings"

	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// target is what a case writes to. The same case body runs against the
// library's part store (F1, F4, F6, F7) and against the suite's own user
// tables written through the backend's fence (F1u, F4u, F6u, F7u): the
// cases are written once, over a target.
type target struct {
	// kind is the holder processes' resource kind for this target.
	kind ResourceKind
	// open returns a client; gap, when not nil, runs inside each write
	// between the fence check and the commit (F6's interleaving).
	open func(c *caseRun, h Harness, gap Gap) Resource
}

// partStore is the backend's part store (OpenResource), with
// CommitGapResources for a gap.
var partStore = target{
	kind: KindFenced,
	open: func(c *caseRun, h Harness, gap Gap) Resource {
		if gap == nil {
			return c.openResource(h)
		}
		gapper := need[CommitGapResources](c, h, AbilityCommitGap)
		res, err := gapper.FencedResourceWithGap(c.ctx, gap)
		c.Must(err, "open the fenced resource with a commit gap")
		return res
	},
}

// userTables is the suite's own user data behind the backend's fence
// (UserDataResources).
var userTables = target{
	kind: KindUserData,
	open: func(c *caseRun, h Harness, gap Gap) Resource {
		return c.openUserResource(h, gap)
	},
}

// openUserResource opens the fenced user resource, or skips (AbilityUserData
// declared absent) or ends the case.
func (c *caseRun) openUserResource(h Harness, gap Gap) UserResource {
	ud := need[UserDataResources](c, h, AbilityUserData)
	res, err := ud.UserDataResource(c.ctx, gap)
	c.Must(err, "open the fenced user resource")
	return res
}

// noteUserTarget prints, for the user-data target, what is written where.
func (c *caseRun) noteUserTarget(t target) {
	if t.kind == KindUserData {
		c.Notef("resource = the suite's own user tables, written through the backend's public fence API, every table and the fence check in one atomic operation")
	}
}

// rowsReader reads every user table's row of a part (UserResource,
// MarkerFirst).
type rowsReader interface {
	Rows(ctx context.Context, scope, part string) ([]UserRow, error)
}

// stored describes what res holds for (scope, part) the way describePart
// does. For a resource with user tables it reads every table as well: when
// all agree with ReadPart the description is the same single one, else it
// lists each table, so a torn write (one table written, another not)
// cannot pass a check that compares descriptions.
func (c *caseRun) stored(res backendkit.ResourceReader, scope, part string) string {
	p, ok := c.readPart(res, scope, part)
	d := describePart(p, ok)
	rr, isRows := res.(rowsReader)
	if !isRows {
		return d
	}
	rows, err := rr.Rows(c.ctx, scope, part)
	c.Must(err, fmt.Sprintf("read the user rows of %s/%s", scope, part))
	if len(rows) < 2 {
		c.Fatalf("the user resource read back %d user table(s) for %s/%s; it must write at least two in one atomic operation", len(rows), scope, part)
	}
	each := []string{"ReadPart: " + d}
	same := true
	for _, r := range rows {
		rd := describePart(r.Row, r.Found)
		if r.Found && (r.Row.Scope != scope || r.Row.Part != part) {
			rd += fmt.Sprintf(" (stored as %s/%s)", r.Row.Scope, r.Row.Part)
		}
		same = same && rd == d
		each = append(each, r.Table+": "+rd)
	}
	if same {
		return d
	}
	return "tables disagree: " + strings.Join(each, "; ")
}
