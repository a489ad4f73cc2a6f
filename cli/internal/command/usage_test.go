package command_test

import (
	"strings"
	"testing"

	"github.com/leasefence/leasefence/cli/internal/command"
)

// TestUsageErrors: bad input is a usage error, exit status 2, whose
// message names the bad argument; nothing is sent (the DSNs and endpoints
// here point nowhere: a command that tried to connect would fail with
// exit status 1 instead, or hang until its timeout).
func TestUsageErrors(t *testing.T) {
	pg := []string{"--dsn", "postgres://nobody@127.0.0.1:1/none"}
	etcd := []string{"--endpoints", "127.0.0.1:1"}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"status", "--bogus"}, "status: flag provided but not defined: -bogus"},
		{[]string{"status"}, "no backend: give --backend, --dsn or --endpoints"},
		{[]string{"status", "--backend", "mysql"}, `--backend "mysql": must be postgres or etcd`},
		{[]string{"status", "--dsn", "x", "--endpoints", "y"}, "both PostgreSQL flags (--dsn) and etcd flags (--endpoints) given"},
		{[]string{"status", "--backend", "etcd", "--schema", "s"}, "PostgreSQL flags (--schema) given, but --backend is etcd"},
		{[]string{"status", "--backend", "postgres", "--prefix", "/p"}, "etcd flags (--prefix) given, but --backend is postgres"},
		{append([]string{"status", "bad\x00name"}, pg...), `invalid NAME "bad\x00name": contains control character`},
		{append([]string{"status", ""}, pg...), "status: invalid NAME: must not be empty"},
		{append([]string{"status", strings.Repeat("n", 201)}, pg...), "longer than 200"},
		{append([]string{"list", "--limit", "0"}, pg...), "--limit 0: must be 1 to 10000"},
		{append([]string{"list", "--limit", "ten"}, pg...), `invalid value "ten" for flag -limit`},
		{append([]string{"status", "--timeout", "0s"}, pg...), "--timeout 0s: must be positive"},
		{[]string{"status", "--dsn", "postgres://x:notaport/db"}, "status: --dsn:"},
		{append([]string{"status", "--schema", "Bad"}, pg...), `invalid schema "Bad"`},
		{append([]string{"status", "--prefix", "no-slash"}, etcd...), `invalid prefix "no-slash": must begin with "/"`},
		{[]string{"status", "--endpoints", "a, ,b"}, `--endpoints "a, ,b": want a comma-separated list`},
		{append([]string{"floors", "=lease"}, pg...), "floors: invalid SCOPE: must not be empty"},
		{append([]string{"attempts"}, pg...), "attempts: takes exactly one SCOPE, got 0"},
		{append([]string{"attempts", "a", "b"}, pg...), "takes exactly one SCOPE, got 2"},
		{append([]string{"attempts", "s", "--since", "yesterday"}, pg...), `--since "yesterday": want a duration`},
		{append([]string{"attempts", "s", "--since", "-1h"}, pg...), `--since "-1h": a duration must be positive`},
		{append([]string{"attempts", "s", "--limit", "10001"}, pg...), "--limit 10001: must be 1 to 10000"},
		{append([]string{"advance", "s"}, pg...), "advance: takes SCOPE and TOKEN, got 1"},
		{append([]string{"advance", "s", "abc"}, pg...), `invalid TOKEN "abc": want a decimal number`},
		{append([]string{"advance", "s", "0"}, pg...), `invalid TOKEN "0": must be positive`},
		{append([]string{"advance", "s", "-3"}, pg...), "flag provided but not defined: -3"},
		{append([]string{"attempts", "s", "--since", "2999-01-01T00:00:00Z"}, pg...), `--since "2999-01-01T00:00:00Z": is in the future`},
		{append([]string{"advance", "s", "9223372036854775808"}, pg...), "above the largest token 9223372036854775806"},
		{append([]string{"advance", "s", "9223372036854775807"}, pg...), "the floor of a sealed scope"},
		{append([]string{"advance", "s", "5", "--writer", " ops"}, pg...), "invalid --writer"},
		{append([]string{"advance", "s", "5", "--lease", ""}, pg...), "invalid --lease"},
		{append([]string{"break"}, pg...), "break: takes exactly one lease NAME, got 0"},
		{append([]string{"break", "job", "--scope", "s"}, pg...), "refusing without --yes or --confirm job"},
		{append([]string{"break", "job", "--scope", "s", "--confirm", "other"}, pg...), `--confirm "other" does not match the lease NAME "job"`},
		{append([]string{"break", "job", "--yes"}, pg...), "--scope is required"},
		{append([]string{"break", "job", "--yes", "--scope", "s", "--ttl", "1ms"}, pg...), "--ttl 1ms: must be 10ms to 24h0m0s"},
		{append([]string{"break", "job", "--yes", "--scope", "s", "--ttl", "-1s"}, pg...), "--ttl -1s: must be positive"},
		{append([]string{"break", "job", "--yes", "--scope", "s", "--ttl", "2500ms"}, etcd...), "--ttl 2.5s: must be whole seconds"},
		{append([]string{"break", "job", "--yes", "--scope", "s", "--holder", ""}, pg...), "invalid --holder: must not be empty"},
		{append([]string{"prune-attempts"}, pg...), "--older-than is required"},
		{append([]string{"prune-attempts", "--older-than", "0s"}, pg...), "--older-than 0s: must be positive"},
		{append([]string{"migrate", "now"}, pg...), "migrate: takes no operands"},
		{[]string{"schema", "a", "b"}, "schema: takes at most one operand"},
		{[]string{"help", "bogus"}, `help: unknown command "bogus"`},
		{[]string{"help", "a", "b"}, "help: takes at most one command"},
	}
	for _, c := range cases {
		r := run(t, c.args...)
		if r.code != command.ExitUsage || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("leasefence %q: want exit 2, nothing on stdout and a message with %q; got %s", c.args, c.want, r)
		}
		if r.code == command.ExitUsage && !strings.Contains(r.stderr, "Run 'leasefence ") && !strings.Contains(r.stderr, "leasecore:") {
			t.Errorf("leasefence %q: the usage error does not say where the usage is:\n%s", c.args, r)
		}
	}
}

// TestBackendFromEnvironment: without --backend or connection flags, the
// backend comes from PG* or ETCDCTL_ENDPOINTS; both set is a usage error.
func TestBackendFromEnvironment(t *testing.T) {
	runEnv := func(env map[string]string, args ...string) result {
		var out, errOut strings.Builder
		code := command.Run(t.Context(), args, command.Env{Stdout: &out, Stderr: &errOut,
			Getenv: func(k string) string { return env[k] }})
		return result{code, out.String(), errOut.String()}
	}
	r := runEnv(map[string]string{"PGHOST": "127.0.0.1", "ETCDCTL_ENDPOINTS": "127.0.0.1:2379"}, "status")
	if r.code != 2 || !strings.Contains(r.stderr, "both PGHOST and ETCDCTL_ENDPOINTS are set") {
		t.Errorf("both environments: %s", r)
	}
	// ETCDCTL_ENDPOINTS alone: etcd, and its value is validated as such.
	r = runEnv(map[string]string{"ETCDCTL_ENDPOINTS": "a b"}, "status")
	if r.code != 2 || !strings.Contains(r.stderr, `ETCDCTL_ENDPOINTS "a b"`) {
		t.Errorf("ETCDCTL_ENDPOINTS: %s", r)
	}
	// A flag wins over the environment.
	r = runEnv(map[string]string{"ETCDCTL_ENDPOINTS": "a b"}, "status", "--dsn", "postgres://x:notaport/db")
	if r.code != 2 || !strings.Contains(r.stderr, "--dsn") {
		t.Errorf("--dsn with ETCDCTL_ENDPOINTS set: %s", r)
	}
}

// TestHelp: --help, help and help COMMAND read like a manual page, on
// stdout, exit status 0, without a backend.
func TestHelp(t *testing.T) {
	sections := []string{"NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "COMMON OPTIONS", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES"}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		r := run(t, args...)
		want(t, r, 0, sections...)
		for _, c := range []string{"status", "list", "floors", "attempts", "advance", "break", "migrate", "schema", "prune-attempts"} {
			if !strings.Contains(r.stdout, "    leasefence "+c) {
				t.Errorf("%q: the manual has no section for %s", args, c)
			}
		}
		for _, s := range []string{"PGHOST", "ETCDCTL_ENDPOINTS", "0   The command did", "2   Usage", "3   Warnings", "--json"} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("%q: the manual lacks %q", args, s)
			}
		}
	}
	for _, args := range [][]string{{"help", "break"}, {"break", "--help"}, {"break", "-h", "--scope", "x"}} {
		r := run(t, args...)
		want(t, r, 0, "NAME\n    leasefence break", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "--confirm NAME", "--scope SCOPE",
			"Advances the floor of every --scope", "Releases the lease")
	}
	want(t, run(t, "attempts", "--help"), 0, "--rejected", "--since", "--limit")
}
