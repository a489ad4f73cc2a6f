package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// How values look in output lines: one place, so that the cases, X1's rows
// and its state diffs print the same thing the same way.

// describePart renders a part the way the notes of the lease-fencing
// article (SOURCES.md) do.
func describePart(p leasecore.StoredPart, ok bool) string {
	if !ok {
		return "(none)"
	}
	return fmt.Sprintf("%s by %s token=%d", p.Content, p.Writer, p.Token)
}

func describeLease(st leasecore.LeaseState) string {
	if !st.Exists {
		return fmt.Sprintf("exists=false held=%t", st.Held)
	}
	return fmt.Sprintf("holder=%s token=%d held=%t released=%t", backendkit.Quote(st.Holder), st.Token, st.Held, st.Released)
}

func describeAttempt(a leasecore.Attempt) string {
	return fmt.Sprintf("%s/%s by %s token=%d accepted=%t floor=%d", backendkit.Quote(a.Scope), backendkit.Quote(a.Part),
		backendkit.Quote(a.Writer), a.Token, a.Accepted, a.Floor)
}

func describeAttempts(as []leasecore.Attempt) string {
	var ds []string
	for _, a := range as {
		ds = append(ds, describeAttempt(a))
	}
	return fmt.Sprintf("%d entries [%s]", len(as), strings.Join(ds, ", "))
}

// sentinels are the errors errKind names, most specific first.
var sentinels = []struct {
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
	{leasecore.ErrConfig, "ErrConfig"},
	{leasecore.ErrClosed, "ErrClosed"},
}

// noSentinel starts errKind's answer for an error that wraps none.
const noSentinel = "an error wrapping no sentinel"

// errKind names the sentinel err wraps ("ErrLost", "context.Canceled"),
// "nil" for no error, and for an error wrapping none says so with its
// message, so that an unexpected error is visible in the line that
// expected a sentinel.
func errKind(err error) string {
	if err == nil {
		return "nil"
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return noSentinel + ": " + quoteMessage(err)
}

// describeErr renders an error for an output line: the sentinel it wraps
// and its message, quoted (one line) and shortened.
func describeErr(err error) string {
	if err == nil {
		return "no error (the call succeeded)"
	}
	k := errKind(err)
	if strings.HasPrefix(k, noSentinel) {
		return k
	}
	return k + " " + quoteMessage(err)
}

// quoteMessage quotes err's message on one line, shortened to 300 bytes.
func quoteMessage(err error) string {
	msg := err.Error()
	if len(msg) > 300 {
		msg = strings.ToValidUTF8(msg[:300], "") + "..."
	}
	return strconv.Quote(msg)
}
