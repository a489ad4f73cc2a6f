package command_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/cli/internal/command"
)

// The tests here need no server; those that run the command against
// PostgreSQL and etcd are in the cli/tests module, which has its own copy
// of these helpers, so that this module requires nothing of the test
// servers (docs/modules.md).

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// run runs the command in-process with an empty environment (the backend
// comes from flags) and the host name "testhost".
func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := command.Run(context.Background(), args, command.Env{
		Stdout: &out, Stderr: &errOut,
		Getenv:   func(string) string { return "" },
		Hostname: func() (string, error) { return "testhost", nil },
	})
	return result{code, out.String(), errOut.String()}
}

// want fails unless r exited with code and its stdout (and stderr) hold
// every one of wants.
func want(t *testing.T, r result, code int, wants ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	for _, w := range wants {
		if !strings.Contains(r.stdout+r.stderr, w) {
			t.Errorf("output lacks %q:\n%s", w, r)
		}
	}
}
