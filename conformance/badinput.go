package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// BadCall is one row of the bad-input table of case X1: a call of one entry
// point whose input is valid except for one field, or whose context is
// already cancelled. It must fail with an error that wraps Want and whose
// message contains Mention, and it must change nothing.
type BadCall struct {
	// Group is the entry point: "acquire", "acquire all", "renew",
	// "release", "renew all", "inspect", "write", "write batch", "read"
	// (Floor, ReadPart and Attempts) or "advance".
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
	return b.check(b.Call(ctx))
}

// check judges err, the error the call returned, as Run does.
func (b BadCall) check(err error) error {
	switch {
	case err == nil:
		return errors.New("no error: the call succeeded")
	case !errors.Is(err, b.Want):
		return fmt.Errorf("got %s, want an error wrapping %s", describeErr(err), errKind(b.Want))
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
	// is a backendkit.BatchRenewer; for AcquireAll when it is a
	// backendkit.BatchAcquirer.
	Lease leasecore.Lease
	// Grant is a valid grant of Lease (name, holder, token, TTL): the
	// renew, release and renew-all rows change one of its fields; the
	// acquire rows use its Holder and TTL.
	Grant leasecore.Grant
	// Free is a valid lease name that the acquire rows try to take and
	// that the renew-all rows give their second grant. The acquire-all
	// rows try to take it with Free + "-2".
	Free string

	// Resource, when not nil, gets rows for Write; for WriteBatch when it
	// is a backendkit.BatchWriter; for Floor, ReadPart and Attempts when it
	// is a backendkit.ResourceReader.
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
	long := base + strings.Repeat("n", max(1, backendkit.MaxNameLen+1-len(base)))
	wide := base + strings.Repeat("é", max(1, (backendkit.MaxNameLen+2-len(base))/2)) // over in bytes, not in runes
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
		badValue[time.Duration]{"above MaxTTL", backendkit.MaxTTL + g},
		badValue[time.Duration]{"MaxInt64", time.Duration(math.MaxInt64)})
}

var badTokens = []badValue[leasecore.Token]{{"zero", 0}, {"above MaxToken", backendkit.MaxToken + 1}}

var badContents = []badValue[string]{
	{"over MaxContentLen", strings.Repeat("c", backendkit.MaxContentLen+1)},
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

		if ba, ok := l.(backendkit.BatchAcquirer); ok {
			const group = "acquire all"
			acquireAll := func(names []string, holder string, ttl time.Duration) func(context.Context) error {
				return func(ctx context.Context) error { _, _, err := ba.AcquireAll(ctx, names, holder, ttl); return err }
			}
			// Two free names: a call that let bad input through would
			// take Free, where the suite looks.
			pair := func(second string) []string { return []string{in.Free, second} }
			okNames := pair(in.Free + "-2")
			addInv(group, "acquire all no names", "names", acquireAll(nil, grant.Holder, grant.TTL))
			many := make([]string, backendkit.MaxAcquireAll+1)
			for i := range many {
				many[i] = fmt.Sprint(in.Free, "-", i)
			}
			addInv(group, "acquire all too many names", "names", acquireAll(many, grant.Holder, grant.TTL))
			addInv(group, "acquire all repeated name", "names[1]", acquireAll(pair(in.Free), grant.Holder, grant.TTL))
			for _, b := range badNames(in.Free + "-2") {
				addInv(group, "acquire all names[1] "+b.label, "names[1]", acquireAll(pair(b.v), grant.Holder, grant.TTL))
			}
			for _, b := range badNames(grant.Holder) {
				addInv(group, "acquire all holder "+b.label, "holder", acquireAll(okNames, b.v, grant.TTL))
			}
			for _, t := range ttls {
				addInv(group, "acquire all ttl "+t.label, "ttl", acquireAll(okNames, grant.Holder, t.v))
			}
			addCancelled(group, "acquire all", acquireAll(okNames, grant.Holder, grant.TTL))
		}

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

		if br, ok := l.(backendkit.BatchRenewer); ok {
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
			many := make([]leasecore.Grant, backendkit.MaxRenewAll+1)
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

		if bw, isBW := r.(backendkit.BatchWriter); isBW {
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
				for i := range backendkit.MaxBatchParts + 1 {
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
				b.Parts[0].Content = strings.Repeat("c", backendkit.MaxContentLen/2+1)
				b.Parts[1].Content = b.Parts[0].Content
			}))
			addCancelled(group, "write batch", func(ctx context.Context) error { _, err := bw.WriteBatch(ctx, okBatch); return err })
		}

		if rr, isRR := r.(backendkit.ResourceReader); isRR {
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
