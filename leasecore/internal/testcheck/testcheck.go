// Package testcheck holds the assertions the tests of leasecore and of
// leasecore/backendkit share: the contract of a validation error and the
// records a JSON slog handler wrote. Only tests import it.
package testcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
)

// WantArgError checks the contract every validation error keeps: it wraps
// ErrInvalidArgument, is an *ArgError naming field (and op), and its message
// names the field so a reader of the log knows what to fix.
func WantArgError(t testing.TB, err error, op, field string) *leasecore.ArgError {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want an *ArgError for field %q", field)
	}
	if !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("errors.Is(%v, ErrInvalidArgument) = false, want true", err)
	}
	var ae *leasecore.ArgError
	if !errors.As(err, &ae) {
		t.Fatalf("errors.As(%v, *ArgError) = false, want true", err)
	}
	if ae.Field != field {
		t.Errorf("ArgError.Field = %q, want %q (err: %v)", ae.Field, field, err)
	}
	if op != "" && ae.Op != op {
		t.Errorf("ArgError.Op = %q, want %q (err: %v)", ae.Op, op, err)
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("message %q does not name the field %q", err.Error(), field)
	}
	if !strings.HasPrefix(err.Error(), "leasecore: ") {
		t.Errorf("message %q lacks the package prefix", err.Error())
	}
	return ae
}

// LogRecords parses a JSON handler's output.
func LogRecords(t testing.TB, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// FindRecord returns the record with message msg, failing when there is
// none.
func FindRecord(t testing.TB, recs []map[string]any, msg string) map[string]any {
	t.Helper()
	for _, r := range recs {
		if r["msg"] == msg {
			return r
		}
	}
	t.Fatalf("no log record %q in %v", msg, recs)
	return nil
}
