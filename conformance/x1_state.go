package conformance

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// x1Watch is what case X1 reads to tell whether a call changed anything.
type x1Watch struct {
	insp   leasecore.LeaseInspector
	res    backendkit.ResourceReader
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
		return fmt.Sprintf("%s by %s token=%d at %s", backendkit.Quote(p.Content), backendkit.Quote(p.Writer),
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
