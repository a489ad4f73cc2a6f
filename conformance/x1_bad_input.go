package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// caseX1 checks the input rule of every entry point: bad input gets an error
// that wraps leasecore.ErrInvalidArgument (context.Canceled for a context
// that is already done) and names the bad field, and nothing changes; a
// renew or release of a hold that is over fails with leasecore.ErrLost and
// changes nothing; odd but valid names (SQL-looking text, slashes,
// non-ASCII, the longest allowed) are accepted and read back verbatim.
//
// "Nothing changes" is judged by what the harness's readers see, before and
// after every call: Inspect of every lease name the calls involve, and the
// floor, parts and write log of their scope. The bad values are made from
// those valid names (" x1-job", "x1-\x00job", ...), so a backend that
// cleans bad input up instead of rejecting it writes where the suite looks.
// A backend's own tests can run the same rows (BadInputCalls) with checks
// only they can make: every table unchanged, a server nobody listens on.
func caseX1(ctx context.Context, c *caseRun, h Harness) {
	lease, insp := c.openLease(h)
	res := c.openResource(h)
	ttl := c.ttl(10 * time.Minute) // outlives the case; released at the end

	// Valid names that contain no field name, so that an error naming
	// the field cannot pass by quoting the value.
	const (
		held     = "x1-job"
		released = "x1-job-released"
		free     = "x1-job-free"
		holder   = "x1-host"
		stranger = "x1-intruder"
		scopeX1  = "x1-report"
		partX1   = "x1-summary"
		detailX1 = "x1-detail"
	)

	// Something in every place the calls could change, so that "nothing
	// changed" means something: a held lease, a released one, a free name,
	// a scope with a floor, a written part and an unwritten one.
	g, err := lease.Acquire(ctx, held, holder, ttl)
	c.Must(err, "acquire "+held)
	gr, err := lease.Acquire(ctx, released, holder, ttl)
	c.Must(err, "acquire "+released)
	c.Must(lease.Release(ctx, gr), "release "+released)
	if r := c.write(res, leasecore.Write{Scope: scopeX1, Part: partX1, Content: "rows=1", Writer: holder, Token: g.Token}); !r.Accepted {
		c.Fatalf("the first write to the fresh scope %s with token %d was rejected (floor %d)", scopeX1, g.Token, r.Floor)
	}
	watch := x1Watch{insp: insp, res: res, leases: []string{held, released, free}, scope: scopeX1, parts: []string{partX1, detailX1}}

	// Every bad call would be accepted if it got through: the token equals
	// the floor, the content differs from what is stored, the free name is
	// free, the held lease is the caller's.
	in := BadInput{
		Lease: lease, Grant: g, Free: free,
		Resource:   res,
		Write:      leasecore.Write{Scope: scopeX1, Part: partX1, Content: "rows=2", Writer: holder, Token: g.Token},
		SecondPart: detailX1,
		MinTTL:     c.traits.MinTTL, TTLGranularity: c.traits.TTLGranularity,
	}
	if _, ok := lease.(backendkit.BatchRenewer); !ok {
		c.Notef("the lease client does not implement backendkit.BatchRenewer: no renew-all rows")
	}
	if _, ok := lease.(backendkit.BatchAcquirer); !ok {
		c.Notef("the lease client does not implement backendkit.BatchAcquirer: no acquire-all rows")
	}
	if _, ok := res.(backendkit.BatchWriter); !ok {
		c.Notef("the resource does not implement backendkit.BatchWriter: no write-batch rows")
	}

	c.x1Rows(watch, BadInputCalls(in))
	c.Section("user data", func(c *caseRun) { c.x1UserData(h, lease, insp, watch.leases, holder, g.Token) })

	// Holds that are over, or not the caller's.
	other := g
	other.Holder = stranger
	type holdRow struct {
		name string
		want error
		call func() error
	}
	holds := []holdRow{
		{"acquire of the held lease by another holder", leasecore.ErrHeld, func() error {
			_, err := lease.Acquire(ctx, held, stranger, ttl)
			return err
		}},
		{"renew by a non-holder", leasecore.ErrLost, func() error { _, err := lease.Renew(ctx, other); return err }},
		{"release by a non-holder", leasecore.ErrLost, func() error { return lease.Release(ctx, other) }},
		{"renew after release", leasecore.ErrLost, func() error { _, err := lease.Renew(ctx, gr); return err }},
		{"release twice", leasecore.ErrLost, func() error { return lease.Release(ctx, gr) }},
	}
	if br, ok := lease.(backendkit.BatchRenewer); ok {
		renewAll := func(gs ...leasecore.Grant) func() error {
			return func() error {
				_, lost, err := br.RenewAll(ctx, gs)
				switch {
				case err != nil:
					return fmt.Errorf("the call failed as a whole: %w", err)
				case len(lost) != len(gs):
					return fmt.Errorf("RenewAll returned %d lost errors for %d grants", len(lost), len(gs))
				}
				return lost[0]
			}
		}
		holds = append(holds,
			holdRow{"renew all by a non-holder (lost[0])", leasecore.ErrLost, renewAll(other)},
			holdRow{"renew all after release (lost[0])", leasecore.ErrLost, renewAll(gr)})
	}
	before := c.x1Read(watch)
	holdsOK := 0
	for _, r := range holds {
		err := r.call()
		var problem error
		if !errors.Is(err, r.want) {
			problem = fmt.Errorf("got %s, want an error wrapping %s", describeErr(err), errKind(r.want))
		}
		if c.x1Row(watch, &before, r.name, fmt.Sprintf("%s; state unchanged", errKind(r.want)), errKind(err), problem) {
			holdsOK++
		}
	}
	c.Notef("holds that are over or not the caller's: %d of %d calls failed with the right sentinel and changed nothing", holdsOK, len(holds))

	c.x1CheckOddNames(lease, insp, res, ttl)
	c.Must(lease.Release(ctx, g), "release "+held)
}

// x1Rows runs bad-input rows against what watch reads: one check per row
// (its error and the state after it), then a note per group (entry point)
// tallying its rows.
func (c *caseRun) x1Rows(watch x1Watch, calls []BadCall) {
	ctx := c.ctx
	type group struct {
		name                 string
		fields               []string       // in order of first appearance
		count                map[string]int // rows per field (ErrInvalidArgument)
		cancelled, total, ok int
	}
	var groups []*group
	byName := map[string]*group{}
	before := c.x1Read(watch)
	for _, b := range calls {
		gp := byName[b.Group]
		if gp == nil {
			gp = &group{name: b.Group, count: map[string]int{}}
			byName[b.Group] = gp
			groups = append(groups, gp)
		}
		gp.total++
		if errors.Is(b.Want, context.Canceled) {
			gp.cancelled++
		} else {
			if gp.count[b.Mention] == 0 {
				gp.fields = append(gp.fields, b.Mention)
			}
			gp.count[b.Mention]++
		}
		err := b.Call(ctx)
		problem := b.check(err)
		if c.x1Row(watch, &before, b.Name, x1Expected(b), fmt.Sprintf("%s naming %q", errKind(err), b.Mention), problem) {
			gp.ok++
		}
	}
	for _, gp := range groups {
		var kinds []string
		for _, f := range gp.fields {
			kinds = append(kinds, fmt.Sprintf("%s %d", f, gp.count[f]))
		}
		what := fmt.Sprintf("%s, bad %s", x1GroupTitle(gp.name), strings.Join(kinds, ", "))
		if gp.cancelled > 0 {
			what += fmt.Sprintf(", cancelled context %d", gp.cancelled)
		}
		c.Notef("%s: %d of %d rows rejected as they must, state unchanged", what, gp.ok, gp.total)
	}
}

// x1UserData runs the write, read and advance rows against the fenced user
// resource (UserDataResources), on a scope of its own that holds a row and
// a floor (token) first: the same tables of bad values as the part store's.
func (c *caseRun) x1UserData(h Harness, lease leasecore.Lease, insp leasecore.LeaseInspector, leases []string, holder string, token leasecore.Token) {
	const (
		scopeUser  = "x1-user-report"
		partUser   = "x1-user-summary"
		detailUser = "x1-user-detail"
	)
	res := c.openUserResource(h, nil)
	if r := c.write(res, leasecore.Write{Scope: scopeUser, Part: partUser, Content: "rows=1", Writer: holder, Token: token}); !r.Accepted {
		c.Fatalf("the first write to the fresh scope %s with token %d was rejected (floor %d)", scopeUser, token, r.Floor)
	}
	watch := x1Watch{insp: insp, res: res, leases: leases, scope: scopeUser, parts: []string{partUser, detailUser}}
	// The valid advance raises the floor (token + 1), so an advance that
	// lets bad input through shows as a changed floor.
	calls := BadInputCalls(BadInput{
		Resource:   res,
		Write:      leasecore.Write{Scope: scopeUser, Part: partUser, Content: "rows=2", Writer: holder, Token: token},
		SecondPart: detailUser,
		Advancer:   res,
		Claim:      leasecore.Claim{Scope: scopeUser, Writer: holder, Token: token + 1},
	})
	for i := range calls {
		calls[i].Group = x1UserPrefix + calls[i].Group
		calls[i].Name = x1UserPrefix + calls[i].Name
	}
	c.x1Rows(watch, calls)
}

// x1UserPrefix starts the groups and rows of the user resource.
const x1UserPrefix = "user data "

// x1GroupTitle starts a group's ok line.
func x1GroupTitle(group string) string {
	if g, ok := strings.CutPrefix(group, x1UserPrefix); ok {
		return "user data: " + x1GroupTitles[g]
	}
	return x1GroupTitles[group]
}

// x1GroupTitles names the entry point of each group.
var x1GroupTitles = map[string]string{
	"acquire":     "Acquire",
	"renew":       "Renew",
	"release":     "Release",
	"renew all":   "RenewAll",
	"inspect":     "Inspect",
	"write":       "Write",
	"write batch": "WriteBatch",
	"read":        "the readers (Floor, ReadPart, Attempts)",
	"advance":     "Advance",
}

// x1Expected renders what a bad call must return.
func x1Expected(b BadCall) string {
	return fmt.Sprintf("%s naming %q; state unchanged", errKind(b.Want), b.Mention)
}

// x1Row checks one call's outcome: its error was right (problem nil;
// observed renders the error that came back) and the state the readers
// see did not change. It moves *before on to the state after the call, so
// a change is reported once, and reports whether the row passed.
func (c *caseRun) x1Row(w x1Watch, before *x1State, row, expected, observed string, problem error) bool {
	after := c.x1Read(w)
	changes := before.changes(after)
	*before = after
	if len(changes) > 0 {
		// A lease renewed right after another renewal need not show a
		// longer remaining time than before; let the time since this
		// change grow past a read's duration, so the next one shows.
		time.Sleep(20 * time.Millisecond)
		*before = c.x1Read(w)
	}
	var actual []string
	if problem != nil {
		actual = append(actual, problem.Error())
	} else {
		actual = append(actual, observed)
	}
	if len(changes) > 0 {
		actual = append(actual, "state changed: "+strings.Join(changes, "; "))
	} else {
		actual = append(actual, "state unchanged")
	}
	return c.Check("input", row, problem == nil && len(changes) == 0, expected, strings.Join(actual, "; "))
}

// x1CheckOddNames checks that odd but valid names are data: every entry point
// accepts them and the readers give them back verbatim.
func (c *caseRun) x1CheckOddNames(lease leasecore.Lease, insp leasecore.LeaseInspector, res Resource, ttl time.Duration) {
	ctx := c.ctx
	passed := 0
	for _, v := range oddValidNames {
		problem := func() error {
			g, err := lease.Acquire(ctx, v, v, ttl)
			switch {
			case err != nil:
				return fmt.Errorf("acquire: %s", describeErr(err))
			case g.Name != v || g.Holder != v:
				return fmt.Errorf("acquire returned name %s holder %s", backendkit.Quote(g.Name), backendkit.Quote(g.Holder))
			case c.traits.TokenStep == 1 && g.Token != 1:
				return fmt.Errorf("acquire of a fresh name returned token %d, want 1", g.Token)
			}
			st, err := insp.Inspect(ctx, v)
			switch {
			case err != nil:
				return fmt.Errorf("inspect: %s", describeErr(err))
			case !st.Exists || !st.Held || st.Holder != v || st.Token != g.Token:
				return fmt.Errorf("inspect: exists=%t held=%t holder=%s token=%d, want the acquired hold (token %d)",
					st.Exists, st.Held, backendkit.Quote(st.Holder), st.Token, g.Token)
			}
			rg, err := lease.Renew(ctx, g)
			switch {
			case err != nil:
				return fmt.Errorf("renew: %s", describeErr(err))
			case rg.Name != v || rg.Holder != v || rg.Token != g.Token:
				return fmt.Errorf("renew returned name %s holder %s token %d", backendkit.Quote(rg.Name), backendkit.Quote(rg.Holder), rg.Token)
			}
			if err := lease.Release(ctx, rg); err != nil {
				return fmt.Errorf("release: %s", describeErr(err))
			}
			r, err := res.Write(ctx, leasecore.Write{Scope: v, Part: v, Content: v, Writer: v, Token: g.Token})
			switch {
			case err != nil:
				return fmt.Errorf("write: %s", describeErr(err))
			case !r.Accepted:
				return fmt.Errorf("the first write to the fresh scope was rejected (floor %d)", r.Floor)
			}
			p, ok, err := res.ReadPart(ctx, v, v)
			switch {
			case err != nil:
				return fmt.Errorf("read part: %s", describeErr(err))
			case !ok || p.Scope != v || p.Part != v || p.Content != v || p.Writer != v || p.Token != g.Token:
				return fmt.Errorf("read part: found=%t scope=%s part=%s content=%s writer=%s token=%d", ok,
					backendkit.Quote(p.Scope), backendkit.Quote(p.Part), backendkit.Quote(p.Content), backendkit.Quote(p.Writer), p.Token)
			}
			f, err := res.Floor(ctx, v)
			switch {
			case err != nil:
				return fmt.Errorf("floor: %s", describeErr(err))
			case f != g.Token:
				return fmt.Errorf("floor %d, want %d", f, g.Token)
			}
			as, err := res.Attempts(ctx, v)
			switch {
			case err != nil:
				return fmt.Errorf("attempts: %s", describeErr(err))
			case c.traits.AttemptLog != leasecore.LogAll:
				// An accepted write is logged with LogAll only.
				if len(as) != 0 {
					return fmt.Errorf("attempts: %s, want none (the harness logs attempts with %s)", describeAttempts(as), c.traits.AttemptLog)
				}
			case len(as) != 1 || as[0].Scope != v || as[0].Part != v || as[0].Writer != v || as[0].Token != g.Token || !as[0].Accepted:
				return fmt.Errorf("attempts: %s, want the one accepted write", describeAttempts(as))
			}
			return nil
		}()
		actual := "accepted everywhere, read back equal"
		if problem != nil {
			actual = problem.Error()
		}
		if c.Check("input", "odd but valid name "+backendkit.Quote(v)+" is accepted by acquire, inspect, renew, release and write, and read back verbatim",
			problem == nil, "accepted everywhere, read back equal", actual) {
			passed++
		}
	}
	c.Notef("odd but valid names (SQL-looking, quotes, slashes, %%, non-ASCII, exactly MaxNameLen bytes): %d of %d accepted and read back verbatim", passed, len(oddValidNames))
}

// oddValidNames are valid names that a careless backend might mangle, run as
// SQL, or let collide with each other as keys. Each is used as lease name,
// holder, scope, part, writer and content at once.
var oddValidNames = []string{
	`x'); DROP TABLE lease; --`,
	`"; DROP TABLE fence_floor; --`,
	`Robert'); DROP TABLE report_part;--`,
	`' OR '1'='1`,
	`$1`, `%`, `_`, `\`, `*`, `-infinity`,
	`a`, `a/b`, `a%2Fb`, `../..`,
	`inner  double  spaces`,
	`日报 summary`,
	"Ünïcødé ✓ 🙂",
	strings.Repeat("é", backendkit.MaxNameLen/2), // exactly MaxNameLen bytes, half as many runes
}
