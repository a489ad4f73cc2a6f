package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leasefence/leasefence/leasecore"
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
	if _, ok := lease.(leasecore.BatchRenewer); !ok {
		c.Notef("the lease client does not implement leasecore.BatchRenewer: no renew-all rows")
	}
	if _, ok := res.(leasecore.BatchWriter); !ok {
		c.Notef("the resource does not implement leasecore.BatchWriter: no write-batch rows")
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
	if br, ok := lease.(leasecore.BatchRenewer); ok {
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
	holdsOK := true
	for _, r := range holds {
		err := r.call()
		var problem error
		if !errors.Is(err, r.want) {
			problem = fmt.Errorf("got %s, want an error wrapping %s", describeErr(err), sentinelName(r.want))
		}
		holdsOK = c.x1Row(watch, &before, r.name, fmt.Sprintf("%s; state unchanged", sentinelName(r.want)), problem) && holdsOK
	}
	if holdsOK {
		n := fmt.Sprintf("%d calls failed, state unchanged", len(holds))
		c.Check("input", "renew and release of a hold that is over or not the caller's fail with ErrLost, "+
			"acquire of a held lease with ErrHeld; nothing changed", true, n, n)
	}

	c.x1CheckOddNames(lease, insp, res, ttl)
	c.Must(lease.Release(ctx, g), "release "+held)
}

// x1Rows runs bad-input rows against what watch reads: a FAIL line per
// row that went wrong, one ok line per group (entry point) whose rows all
// failed as they must and changed nothing.
func (c *caseRun) x1Rows(watch x1Watch, calls []BadCall) {
	ctx := c.ctx
	type group struct {
		name             string
		fields           []string       // in order of first appearance
		count            map[string]int // rows per field (ErrInvalidArgument)
		cancelled, total int
		failed           bool
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
		if !c.x1Row(watch, &before, b.Name, x1Expected(b), b.Run(ctx)) {
			gp.failed = true
		}
	}
	for _, gp := range groups {
		if gp.failed {
			continue // its rows said what is wrong
		}
		var kinds []string
		bad := 0
		for _, f := range gp.fields {
			kinds = append(kinds, fmt.Sprintf("%s %d", f, gp.count[f]))
			bad += gp.count[f]
		}
		what := fmt.Sprintf("%s %d bad inputs (%s) with ErrInvalidArgument naming the field", x1GroupTitle(gp.name), bad, strings.Join(kinds, ", "))
		if gp.cancelled > 0 {
			what += ", and a cancelled context with context.Canceled"
		}
		n := fmt.Sprintf("%d calls rejected, state unchanged", gp.total)
		c.Check("input", what+"; nothing changed", true, n, n)
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
	"acquire":     "Acquire rejects",
	"renew":       "Renew rejects",
	"release":     "Release rejects",
	"renew all":   "RenewAll rejects",
	"inspect":     "Inspect rejects",
	"write":       "Write rejects",
	"write batch": "WriteBatch rejects",
	"read":        "the readers (Floor, ReadPart, Attempts) reject",
	"advance":     "Advance rejects",
}

// x1Expected renders what a bad call must return.
func x1Expected(b BadCall) string {
	return fmt.Sprintf("%s naming %q; state unchanged", sentinelName(b.Want), b.Mention)
}

// x1Row records one call's outcome: a FAIL line naming the row when the
// call's error was wrong (problem) or the state changed; nothing when all
// is well (the row's group prints one ok line). It moves *before on to the
// state after the call, so a change is reported once.
func (c *caseRun) x1Row(w x1Watch, before *x1State, row, expected string, problem error) bool {
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
	if problem == nil && len(changes) == 0 {
		return true
	}
	var actual []string
	if problem != nil {
		actual = append(actual, problem.Error())
	} else {
		actual = append(actual, "the error was right")
	}
	if len(changes) > 0 {
		actual = append(actual, "state changed: "+strings.Join(changes, "; "))
	}
	c.Check("input", row, false, expected, strings.Join(actual, "; "))
	return false
}

// x1CheckOddNames checks that odd but valid names are data: every entry point
// accepts them and the readers give them back verbatim.
func (c *caseRun) x1CheckOddNames(lease leasecore.Lease, insp leasecore.LeaseInspector, res Resource, ttl time.Duration) {
	ctx := c.ctx
	failed := false
	for _, v := range oddValidNames {
		problem := func() error {
			g, err := lease.Acquire(ctx, v, v, ttl)
			switch {
			case err != nil:
				return fmt.Errorf("acquire: %s", describeErr(err))
			case g.Name != v || g.Holder != v:
				return fmt.Errorf("acquire returned name %s holder %s", shortQuote(g.Name), shortQuote(g.Holder))
			case c.traits.TokenStep == 1 && g.Token != 1:
				return fmt.Errorf("acquire of a fresh name returned token %d, want 1", g.Token)
			}
			st, err := insp.Inspect(ctx, v)
			switch {
			case err != nil:
				return fmt.Errorf("inspect: %s", describeErr(err))
			case !st.Exists || !st.Held || st.Holder != v || st.Token != g.Token:
				return fmt.Errorf("inspect: exists=%t held=%t holder=%s token=%d, want the acquired hold (token %d)",
					st.Exists, st.Held, shortQuote(st.Holder), st.Token, g.Token)
			}
			rg, err := lease.Renew(ctx, g)
			switch {
			case err != nil:
				return fmt.Errorf("renew: %s", describeErr(err))
			case rg.Name != v || rg.Holder != v || rg.Token != g.Token:
				return fmt.Errorf("renew returned name %s holder %s token %d", shortQuote(rg.Name), shortQuote(rg.Holder), rg.Token)
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
					shortQuote(p.Scope), shortQuote(p.Part), shortQuote(p.Content), shortQuote(p.Writer), p.Token)
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
			case len(as) != 1 || as[0].Scope != v || as[0].Part != v || as[0].Writer != v || as[0].Token != g.Token || !as[0].Accepted:
				return fmt.Errorf("attempts: %s, want the one accepted write", describeAttempts(as))
			}
			return nil
		}()
		if problem != nil {
			failed = true
			c.Check("input", "odd but valid name "+shortQuote(v)+" is accepted and read back verbatim", false,
				"accepted everywhere, read back equal", problem.Error())
		}
	}
	if !failed {
		n := fmt.Sprintf("%d names accepted, read back equal", len(oddValidNames))
		c.Check("input", "odd but valid names (SQL-looking, quotes, slashes, %, non-ASCII, exactly MaxNameLen bytes) "+
			"are accepted by acquire, inspect, renew, release and write, and read back verbatim", true, n, n)
	}
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
	strings.Repeat("é", leasecore.MaxNameLen/2), // exactly MaxNameLen bytes, half as many runes
}

// x1Watch is what case X1 reads to tell whether a call changed anything.
type x1Watch struct {
	insp   leasecore.LeaseInspector
	res    leasecore.ResourceReader
	leases []string
	scope  string
	parts  []string
}

// x1State is what the readers showed at one moment.
type x1State struct {
	leases   []leasecore.LeaseState // in the order of x1Watch.leases
	floor    leasecore.Token
	parts    []string // "scope/part", in the order of x1Watch.parts
	stored   []string // each part rendered, "(none)" when never written
	attempts []string // rendered
}

func (c *caseRun) x1Read(w x1Watch) x1State {
	var s x1State
	for _, name := range w.leases {
		st, err := w.insp.Inspect(c.ctx, name)
		c.Must(err, "inspect "+name)
		s.leases = append(s.leases, st)
	}
	s.floor = c.floor(w.res, w.scope)
	render := func(p leasecore.StoredPart, ok bool) string {
		if !ok {
			return "(none)"
		}
		return fmt.Sprintf("%s by %s token=%d at %s", shortQuote(p.Content), shortQuote(p.Writer),
			p.Token, p.WrittenAt.UTC().Format(time.RFC3339Nano))
	}
	for _, part := range w.parts {
		s.parts = append(s.parts, w.scope+"/"+part)
		rr, isRows := w.res.(rowsReader)
		if !isRows {
			s.stored = append(s.stored, render(c.readPart(w.res, w.scope, part)))
			continue
		}
		// Every user table: a bad write that reached one of them changed it.
		rows, err := rr.Rows(c.ctx, w.scope, part)
		c.Must(err, fmt.Sprintf("read the user rows of %s/%s", w.scope, part))
		var each []string
		for _, r := range rows {
			each = append(each, r.Table+": "+render(r.Row, r.Found))
		}
		s.stored = append(s.stored, strings.Join(each, ", "))
	}
	as, err := w.res.Attempts(c.ctx, w.scope)
	c.Must(err, "read the write log of "+w.scope)
	for _, a := range as {
		s.attempts = append(s.attempts, describeAttempt(a))
	}
	return s
}

// changes describes how after differs from s. Remaining may only shrink:
// a lease's remaining time that grew was renewed. (Only where the backend
// reports it finely enough: etcd reports whole seconds.)
func (s x1State) changes(after x1State) []string {
	var out []string
	for i, b := range s.leases {
		a := after.leases[i]
		if lr, la := describeLease(b), describeLease(a); lr != la {
			out = append(out, fmt.Sprintf("lease %s: %s -> %s", b.Name, lr, la))
		} else if a.Remaining > b.Remaining {
			out = append(out, fmt.Sprintf("lease %s: remaining time grew from %v to %v (renewed)", b.Name, b.Remaining, a.Remaining))
		}
	}
	if s.floor != after.floor {
		out = append(out, fmt.Sprintf("floor %d -> %d", s.floor, after.floor))
	}
	for i, b := range s.stored {
		if a := after.stored[i]; a != b {
			out = append(out, fmt.Sprintf("part %s: %s -> %s", s.parts[i], b, a))
		}
	}
	if !slices.Equal(s.attempts, after.attempts) {
		d := fmt.Sprintf("write log %d -> %d entries", len(s.attempts), len(after.attempts))
		if n := len(after.attempts); n > 0 {
			d += ", last " + after.attempts[n-1]
		}
		out = append(out, d)
	}
	return out
}

func describeLease(st leasecore.LeaseState) string {
	if !st.Exists {
		return fmt.Sprintf("exists=false held=%t", st.Held)
	}
	return fmt.Sprintf("holder=%s token=%d held=%t released=%t", shortQuote(st.Holder), st.Token, st.Held, st.Released)
}

func describeAttempt(a leasecore.Attempt) string {
	return fmt.Sprintf("%s/%s by %s token=%d accepted=%t floor=%d", shortQuote(a.Scope), shortQuote(a.Part),
		shortQuote(a.Writer), a.Token, a.Accepted, a.Floor)
}

func describeAttempts(as []leasecore.Attempt) string {
	var ds []string
	for _, a := range as {
		ds = append(ds, describeAttempt(a))
	}
	return fmt.Sprintf("%d entries [%s]", len(as), strings.Join(ds, ", "))
}

// describeErr renders an error for an output line: the sentinel it wraps and
// its message, quoted (one line) and shortened.
func describeErr(err error) string {
	if err == nil {
		return "no error (the call succeeded)"
	}
	msg := err.Error()
	if len(msg) > 300 {
		msg = strings.ToValidUTF8(msg[:300], "") + "..."
	}
	return fmt.Sprintf("%s %s", sentinelName(err), strconv.Quote(msg))
}

// sentinelName names the sentinel err wraps.
func sentinelName(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{
		{leasecore.ErrInvalidArgument, "ErrInvalidArgument"},
		{context.Canceled, "context.Canceled"},
		{context.DeadlineExceeded, "context.DeadlineExceeded"},
		{leasecore.ErrLost, "ErrLost"},
		{leasecore.ErrHeld, "ErrHeld"},
		{leasecore.ErrUnavailable, "ErrUnavailable"},
		{leasecore.ErrSchema, "ErrSchema"},
		{leasecore.ErrClosed, "ErrClosed"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "an error wrapping no sentinel:"
}

// shortQuote quotes s on one line, shortened to 40 runes.
func shortQuote(s string) string {
	const max = 40
	if utf8.RuneCountInString(s) <= max {
		return strconv.Quote(s)
	}
	n := 0
	for i := range s {
		if n == max {
			return strconv.Quote(s[:i]) + "..."
		}
		n++
	}
	return strconv.Quote(s)
}

// BadCall is one row of the bad-input table of case X1: a call of one entry
// point whose input is valid except for one field, or whose context is
// already cancelled. It must fail with an error that wraps Want and whose
// message contains Mention, and it must change nothing.
type BadCall struct {
	// Group is the entry point: "acquire", "renew", "release", "renew all",
	// "inspect", "write", "write batch", "read" (Floor, ReadPart and
	// Attempts) or "advance".
	Group string
	// Name is the row, unique within one table, e.g. "acquire holder
	// leading space" or "write batch cancelled context".
	Name string
	// Want is leasecore.ErrInvalidArgument, or context.Canceled for a
	// cancelled context.
	Want error
	// Mention is what the error message must contain: the bad field
	// ("holder", "ttl", "parts[1].part", "grants[1].name"), or "context
	// canceled".
	Mention string
	// Reason, when not empty, is more text the message must contain.
	// BadInputCalls leaves it empty: X1 checks that the field is named,
	// not how the reason is worded. A backend's own test may set it.
	Reason string
	// Call makes the call. It cancels the context itself where the row
	// needs that.
	Call func(ctx context.Context) error
}

// Run makes the call and returns nil when it failed as it must: with an
// error wrapping b.Want whose message contains b.Mention (and b.Reason)
// and, when it is a *leasecore.ArgError, whose Field is b.Mention. Otherwise it returns an
// error that says what came back. Whether anything changed is the caller's
// to check.
func (b BadCall) Run(ctx context.Context) error {
	err := b.Call(ctx)
	switch {
	case err == nil:
		return errors.New("no error: the call succeeded")
	case !errors.Is(err, b.Want):
		return fmt.Errorf("got %s, want an error wrapping %s", describeErr(err), sentinelName(b.Want))
	case !strings.Contains(err.Error(), b.Mention):
		return fmt.Errorf("got %s, which does not name %q", describeErr(err), b.Mention)
	case !strings.Contains(err.Error(), b.Reason):
		return fmt.Errorf("got %s, which does not say %q", describeErr(err), b.Reason)
	}
	var ae *leasecore.ArgError
	if errors.Is(b.Want, leasecore.ErrInvalidArgument) && errors.As(err, &ae) && ae.Field != b.Mention {
		return fmt.Errorf("got %s, a *leasecore.ArgError for field %q, want field %q", describeErr(err), ae.Field, b.Mention)
	}
	return nil
}

// BadInput is the valid input BadInputCalls starts from: each of its rows
// changes one field of it, or cancels the context. For a row to show a
// backend that lets bad input through, the valid call should succeed and
// change something visible (a free name, a token equal to the floor,
// content different from what is stored).
//
// Keep field names ("name", "holder", "scope", "part", "writer", "ttl",
// "token", "content") out of the valid values: the bad values are made from
// them, and an error that quotes the value would then seem to name the
// field.
type BadInput struct {
	// Lease, when not nil, gets rows for Acquire, Renew and Release; for
	// Inspect when it is a leasecore.LeaseInspector; for RenewAll when it
	// is a leasecore.BatchRenewer.
	Lease leasecore.Lease
	// Grant is a valid grant of Lease (name, holder, token, TTL): the
	// renew, release and renew-all rows change one of its fields; the
	// acquire rows use its Holder and TTL.
	Grant leasecore.Grant
	// Free is a valid lease name that the acquire rows try to take and
	// that the renew-all rows give their second grant.
	Free string

	// Resource, when not nil, gets rows for Write; for WriteBatch when it
	// is a leasecore.BatchWriter; for Floor, ReadPart and Attempts when it
	// is a leasecore.ResourceReader.
	Resource leasecore.FencedResource
	// Write is a valid write. The write-batch rows write its scope, writer
	// and token with two parts: Write.Part and SecondPart, both with
	// Write.Content.
	Write leasecore.Write
	// SecondPart is the second part of the batch rows; empty means
	// Write.Part + "-2".
	SecondPart string

	// Advancer, when not nil, gets rows for Advance: Claim with its
	// scope, writer or token made bad, and a cancelled context. For a
	// row to show an advance that lets bad input through, Claim.Token
	// should be above the scope's floor.
	Advancer Advancer
	// Claim is a valid claim of Advancer.
	Claim leasecore.Claim

	// MinTTL and TTLGranularity are the backend's (Traits): a TTL row
	// that must fail for one reason only is built from them.
	MinTTL, TTLGranularity time.Duration
}

// badValue is one bad value with its label.
type badValue[T any] struct {
	label string
	v     T
}

// badNames returns the kinds of bad identifier, each made from the valid
// base: a backend that trims, strips or truncates instead of rejecting then
// writes under base, where the suite looks.
func badNames(base string) []badValue[string] {
	mid := 0 // a rune boundary near the middle
	for i := range base {
		if i >= len(base)/2 {
			mid = i
			break
		}
	}
	at := func(s string) string { return base[:mid] + s + base[mid:] }
	long := base + strings.Repeat("n", max(1, leasecore.MaxNameLen+1-len(base)))
	wide := base + strings.Repeat("é", max(1, (leasecore.MaxNameLen+2-len(base))/2)) // over in bytes, not in runes
	return []badValue[string]{
		{"empty", ""},
		{"whitespace only", " \t "},
		{"leading space", " " + base},
		{"trailing space", base + " "},
		{"over-long", long},
		{"over-long in bytes (multi-byte runes)", wide},
		{"NUL", at("\x00")},
		{"control character", at("\n")},
		{"DEL", at("\x7f")},
		{"C1 control character", at("\u0085")},
		{"invalid UTF-8", at("\xff")},
	}
}

// badTTLs returns the bad TTLs for a backend with the given minimum and
// granularity. Each is bad for one reason where it can be: the one above
// the maximum is a multiple of the granularity.
func badTTLs(minTTL, gran time.Duration) []badValue[time.Duration] {
	g := max(gran, time.Nanosecond)
	ttls := []badValue[time.Duration]{{"zero", 0}, {"negative", -time.Second}}
	if minTTL > time.Nanosecond {
		below := minTTL - g
		if below <= 0 {
			below = minTTL - time.Nanosecond
		}
		ttls = append(ttls, badValue[time.Duration]{"below MinTTL", below})
	}
	return append(ttls,
		badValue[time.Duration]{"above MaxTTL", leasecore.MaxTTL + g},
		badValue[time.Duration]{"MaxInt64", time.Duration(math.MaxInt64)})
}

var badTokens = []badValue[leasecore.Token]{{"zero", 0}, {"above MaxToken", leasecore.MaxToken + 1}}

var badContents = []badValue[string]{
	{"over MaxContentLen", strings.Repeat("c", leasecore.MaxContentLen+1)},
	{"NUL", "report\x00body"},
	{"invalid UTF-8", "report\xffbody"},
}

// BadInputCalls returns the bad-input rows of case X1 for in: bad names,
// holders, scopes, parts and writers (empty, whitespace, over-long, control
// characters, invalid UTF-8), TTLs, tokens and contents on every entry
// point, the batch's and renew-all's own rules (count, duplicates, total
// size), and a cancelled context on every entry point.
func BadInputCalls(in BadInput) []BadCall {
	var calls []BadCall
	add := func(group, name string, want error, mention string, call func(ctx context.Context) error) {
		calls = append(calls, BadCall{Group: group, Name: name, Want: want, Mention: mention, Call: call})
	}
	inv := leasecore.ErrInvalidArgument
	addInv := func(group, name, field string, call func(ctx context.Context) error) {
		add(group, name, inv, field, call)
	}
	addCancelled := func(group, op string, call func(ctx context.Context) error) {
		add(group, op+" cancelled context", context.Canceled, "context canceled", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return call(ctx)
		})
	}
	ttls := badTTLs(in.MinTTL, in.TTLGranularity)

	if l := in.Lease; l != nil {
		grant := in.Grant
		with := func(f func(*leasecore.Grant)) leasecore.Grant { g := grant; f(&g); return g }
		acquire := func(name, holder string, ttl time.Duration) func(context.Context) error {
			return func(ctx context.Context) error { _, err := l.Acquire(ctx, name, holder, ttl); return err }
		}
		renew := func(g leasecore.Grant) func(context.Context) error {
			return func(ctx context.Context) error { _, err := l.Renew(ctx, g); return err }
		}
		release := func(g leasecore.Grant) func(context.Context) error {
			return func(ctx context.Context) error { return l.Release(ctx, g) }
		}
		for _, b := range badNames(in.Free) {
			addInv("acquire", "acquire name "+b.label, "name", acquire(b.v, grant.Holder, grant.TTL))
		}
		for _, b := range badNames(grant.Holder) {
			addInv("acquire", "acquire holder "+b.label, "holder", acquire(in.Free, b.v, grant.TTL))
		}
		for _, t := range ttls {
			addInv("acquire", "acquire ttl "+t.label, "ttl", acquire(in.Free, grant.Holder, t.v))
		}
		addCancelled("acquire", "acquire", acquire(in.Free, grant.Holder, grant.TTL))

		for _, op := range []struct {
			name string
			call func(leasecore.Grant) func(context.Context) error
		}{{"renew", renew}, {"release", release}} {
			for _, b := range badNames(grant.Name) {
				addInv(op.name, op.name+" name "+b.label, "name", op.call(with(func(g *leasecore.Grant) { g.Name = b.v })))
			}
			for _, b := range badNames(grant.Holder) {
				addInv(op.name, op.name+" holder "+b.label, "holder", op.call(with(func(g *leasecore.Grant) { g.Holder = b.v })))
			}
			for _, t := range badTokens {
				addInv(op.name, op.name+" token "+t.label, "token", op.call(with(func(g *leasecore.Grant) { g.Token = t.v })))
			}
			for _, t := range ttls {
				addInv(op.name, op.name+" ttl "+t.label, "ttl", op.call(with(func(g *leasecore.Grant) { g.TTL = t.v })))
			}
			addCancelled(op.name, op.name, op.call(grant))
		}

		if br, ok := l.(leasecore.BatchRenewer); ok {
			const group = "renew all"
			renewAll := func(gs []leasecore.Grant) func(context.Context) error {
				return func(ctx context.Context) error { _, _, err := br.RenewAll(ctx, gs); return err }
			}
			second := with(func(g *leasecore.Grant) { g.Name = in.Free })
			pair := func(f func(*leasecore.Grant)) []leasecore.Grant {
				g := second
				f(&g)
				return []leasecore.Grant{grant, g}
			}
			addInv(group, "renew all no grants", "grants", renewAll(nil))
			many := make([]leasecore.Grant, leasecore.MaxRenewAll+1)
			for i := range many {
				many[i] = with(func(g *leasecore.Grant) { g.Name = fmt.Sprint(grant.Name, "-", i) })
			}
			addInv(group, "renew all too many grants", "grants", renewAll(many))
			addInv(group, "renew all two holders", "grants[1].holder",
				renewAll(pair(func(g *leasecore.Grant) { g.Holder = grant.Holder + "-2" })))
			addInv(group, "renew all repeated name", "grants[1].name",
				renewAll(pair(func(g *leasecore.Grant) { g.Name = grant.Name })))
			for _, b := range badNames(in.Free) {
				addInv(group, "renew all grants[1].name "+b.label, "grants[1].name",
					renewAll(pair(func(g *leasecore.Grant) { g.Name = b.v })))
			}
			for _, b := range badNames(grant.Holder) {
				addInv(group, "renew all grants[1].holder "+b.label, "grants[1].holder",
					renewAll(pair(func(g *leasecore.Grant) { g.Holder = b.v })))
			}
			for _, t := range badTokens {
				addInv(group, "renew all grants[1].token "+t.label, "grants[1].token",
					renewAll(pair(func(g *leasecore.Grant) { g.Token = t.v })))
			}
			for _, t := range ttls {
				addInv(group, "renew all grants[1].ttl "+t.label, "grants[1].ttl",
					renewAll(pair(func(g *leasecore.Grant) { g.TTL = t.v })))
			}
			addCancelled(group, "renew all", renewAll([]leasecore.Grant{grant, second}))
		}

		if insp, ok := l.(leasecore.LeaseInspector); ok {
			inspect := func(name string) func(context.Context) error {
				return func(ctx context.Context) error { _, err := insp.Inspect(ctx, name); return err }
			}
			for _, b := range badNames(grant.Name) {
				addInv("inspect", "inspect name "+b.label, "name", inspect(b.v))
			}
			addCancelled("inspect", "inspect", inspect(grant.Name))
		}
	}

	if r := in.Resource; r != nil {
		ok := in.Write
		withW := func(f func(*leasecore.Write)) leasecore.Write { w := ok; f(&w); return w }
		write := func(w leasecore.Write) func(context.Context) error {
			return func(ctx context.Context) error { _, err := r.Write(ctx, w); return err }
		}
		for _, b := range badNames(ok.Scope) {
			addInv("write", "write scope "+b.label, "scope", write(withW(func(w *leasecore.Write) { w.Scope = b.v })))
		}
		for _, b := range badNames(ok.Part) {
			addInv("write", "write part "+b.label, "part", write(withW(func(w *leasecore.Write) { w.Part = b.v })))
		}
		for _, b := range badNames(ok.Writer) {
			addInv("write", "write writer "+b.label, "writer", write(withW(func(w *leasecore.Write) { w.Writer = b.v })))
		}
		for _, t := range badTokens {
			addInv("write", "write token "+t.label, "token", write(withW(func(w *leasecore.Write) { w.Token = t.v })))
		}
		for _, c := range badContents {
			addInv("write", "write content "+c.label, "content", write(withW(func(w *leasecore.Write) { w.Content = c.v })))
		}
		addCancelled("write", "write", write(ok))

		if bw, isBW := r.(leasecore.BatchWriter); isBW {
			const group = "write batch"
			second := in.SecondPart
			if second == "" {
				second = ok.Part + "-2"
			}
			okBatch := leasecore.Batch{Scope: ok.Scope, Writer: ok.Writer, Token: ok.Token,
				Parts: []leasecore.PartContent{{Part: ok.Part, Content: ok.Content}, {Part: second, Content: ok.Content}}}
			withB := func(f func(*leasecore.Batch)) leasecore.Batch {
				b := okBatch
				b.Parts = slices.Clone(okBatch.Parts)
				f(&b)
				return b
			}
			batch := func(label, field string, b leasecore.Batch) {
				addInv(group, "write batch "+label, field, func(ctx context.Context) error {
					_, err := bw.WriteBatch(ctx, b)
					return err
				})
			}
			for _, n := range badNames(ok.Scope) {
				batch("scope "+n.label, "scope", withB(func(b *leasecore.Batch) { b.Scope = n.v }))
			}
			for _, n := range badNames(ok.Writer) {
				batch("writer "+n.label, "writer", withB(func(b *leasecore.Batch) { b.Writer = n.v }))
			}
			for _, n := range badNames(second) {
				batch("parts[1].part "+n.label, "parts[1].part", withB(func(b *leasecore.Batch) { b.Parts[1].Part = n.v }))
			}
			batch("repeated part", "parts[1].part", withB(func(b *leasecore.Batch) { b.Parts[1].Part = b.Parts[0].Part }))
			batch("no parts", "parts", withB(func(b *leasecore.Batch) { b.Parts = nil }))
			batch("too many parts", "parts", withB(func(b *leasecore.Batch) {
				b.Parts = nil
				for i := range leasecore.MaxBatchParts + 1 {
					b.Parts = append(b.Parts, leasecore.PartContent{Part: fmt.Sprint(ok.Part, "-", i), Content: ok.Content})
				}
			}))
			for _, t := range badTokens {
				batch("token "+t.label, "token", withB(func(b *leasecore.Batch) { b.Token = t.v }))
			}
			for _, c := range badContents {
				batch("parts[1].content "+c.label, "parts[1].content", withB(func(b *leasecore.Batch) { b.Parts[1].Content = c.v }))
			}
			batch("content over MaxContentLen in all", "parts", withB(func(b *leasecore.Batch) {
				b.Parts[0].Content = strings.Repeat("c", leasecore.MaxContentLen/2+1)
				b.Parts[1].Content = b.Parts[0].Content
			}))
			addCancelled(group, "write batch", func(ctx context.Context) error { _, err := bw.WriteBatch(ctx, okBatch); return err })
		}

		if rr, isRR := r.(leasecore.ResourceReader); isRR {
			const group = "read"
			floor := func(scope string) func(context.Context) error {
				return func(ctx context.Context) error { _, err := rr.Floor(ctx, scope); return err }
			}
			readPart := func(scope, part string) func(context.Context) error {
				return func(ctx context.Context) error { _, _, err := rr.ReadPart(ctx, scope, part); return err }
			}
			attempts := func(scope string) func(context.Context) error {
				return func(ctx context.Context) error { _, err := rr.Attempts(ctx, scope); return err }
			}
			for _, b := range badNames(ok.Scope) {
				addInv(group, "floor scope "+b.label, "scope", floor(b.v))
				addInv(group, "read part scope "+b.label, "scope", readPart(b.v, ok.Part))
				addInv(group, "attempts scope "+b.label, "scope", attempts(b.v))
			}
			for _, b := range badNames(ok.Part) {
				addInv(group, "read part part "+b.label, "part", readPart(ok.Scope, b.v))
			}
			addCancelled(group, "floor", floor(ok.Scope))
			addCancelled(group, "read part", readPart(ok.Scope, ok.Part))
			addCancelled(group, "attempts", attempts(ok.Scope))
		}
	}
	if a := in.Advancer; a != nil {
		const group = "advance"
		ok := in.Claim
		advance := func(f func(*leasecore.Claim)) func(context.Context) error {
			cl := ok
			f(&cl)
			return func(ctx context.Context) error { _, err := a.Advance(ctx, cl); return err }
		}
		for _, b := range badNames(ok.Scope) {
			addInv(group, "advance scope "+b.label, "scope", advance(func(cl *leasecore.Claim) { cl.Scope = b.v }))
		}
		for _, b := range badNames(ok.Writer) {
			addInv(group, "advance writer "+b.label, "writer", advance(func(cl *leasecore.Claim) { cl.Writer = b.v }))
		}
		for _, t := range badTokens {
			addInv(group, "advance token "+t.label, "token", advance(func(cl *leasecore.Claim) { cl.Token = t.v }))
		}
		addCancelled(group, "advance", advance(func(*leasecore.Claim) {}))
	}
	return calls
}
