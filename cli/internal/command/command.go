// Package command is the leasefence command: its subcommands, flags,
// output and exit codes. main only calls Main; tests call Run in-process
// with their own arguments, environment and writers.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Exit statuses (EXIT STATUS in the manual).
const (
	ExitOK       = 0 // the command did what it was asked
	ExitError    = 1 // it failed: a server unreachable, a refused operation, ...
	ExitUsage    = 2 // bad command line; nothing was sent or written
	ExitWarnings = 3 // it ran, and found a token-space mix-up (floors, break)
)

// Env is what a run sees of its process: the writers and the environment.
type Env struct {
	Stdout, Stderr io.Writer
	// Getenv reads the environment: the backend is inferred from PG* and
	// ETCDCTL_ENDPOINTS. pgx reads PG* itself (os.Getenv) when no DSN is
	// given, so tests that want other values pass flags.
	Getenv func(string) string
	// Hostname names the default operator holder; os.Hostname if nil.
	Hostname func() (string, error)
}

// Main runs the command on the process's arguments and environment; an
// interrupt (SIGINT, SIGTERM) cancels what is in flight.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
}

// usageError is a bad command line: exit 2, nothing sent.
type usageError struct {
	cmd string // the subcommand, "" before one was named
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// errWarnings: the command ran and printed its warnings; exit 3.
var errWarnings = errors.New("warnings found")

// Run runs the command line args (without the program name) and returns
// the exit status.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Hostname == nil {
		env.Hostname = os.Hostname
	}
	r := &runner{env: env, stdout: env.Stdout, stderr: env.Stderr}
	err := r.run(ctx, args)
	if r.backend != nil {
		r.backend.close()
	}
	return r.exit(err)
}

// exit prints err as the manual says and maps it to an exit status.
func (r *runner) exit(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, errWarnings):
		return ExitWarnings
	case errors.As(err, &ue):
		fmt.Fprintf(r.stderr, "leasefence: %s\n", ue.msg)
		if ue.cmd != "" {
			fmt.Fprintf(r.stderr, "Run 'leasefence help %s' for its usage.\n", ue.cmd)
		} else {
			fmt.Fprintln(r.stderr, "Run 'leasefence --help' for the manual.")
		}
		return ExitUsage
	case errors.Is(err, leasecore.ErrInvalidArgument):
		// The library refused the input before anything was sent.
		fmt.Fprintf(r.stderr, "leasefence: %s: %v\n", r.cmdName(), err)
		return ExitUsage
	}
	fmt.Fprintf(r.stderr, "leasefence: %s: %v\n", r.cmdName(), err)
	return ExitError
}

// runner is one run: the parsed options, the backend once opened, and
// the writers.
type runner struct {
	env            Env
	stdout, stderr io.Writer
	opts           options
	cmd            *command
	backend        backend
}

func (r *runner) cmdName() string {
	if r.cmd == nil {
		return "leasefence"
	}
	return r.cmd.name
}

// command is one subcommand.
type command struct {
	name    string
	args    string // the operands in the synopsis, e.g. "[NAME...]"
	summary string // one line, for the command list
	doc     string // DESCRIPTION, for its manual section
	flags   []string
	needs   need // which stores it opens
	run     func(ctx context.Context, r *runner, args []string) error
}

// need says what a command connects to.
type need int

const (
	needNothing need = iota
	needLease
	needFence
	needBoth
)

// commands, in the manual's order.
var commands []*command

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func commandNames() string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (r *runner) run(ctx context.Context, args []string) error {
	r.opts.timeout = defaultTimeout
	global := newFlagSet("leasefence", &r.opts, nil)
	if err := global.Parse(args); err != nil {
		return usagef("", "%v", err)
	}
	rest := global.Args()
	if len(rest) == 0 {
		if r.opts.help {
			return writeManual(r.stdout)
		}
		return usagef("", "no command given (one of %s)", commandNames())
	}
	name := rest[0]
	if name == "help" {
		return r.help(rest[1:])
	}
	r.cmd = lookup(name)
	if r.cmd == nil {
		return usagef("", "unknown command %q (one of %s, or help)", name, commandNames())
	}
	fs := newFlagSet(name, &r.opts, r.cmd.flags)
	operands, err := parseInterleaved(fs, rest[1:])
	if err != nil {
		return usagef(name, "%s: %v", name, err)
	}
	if r.opts.help {
		return writeCommandManual(r.stdout, r.cmd)
	}
	r.opts.seen(global, fs)
	if err := r.opts.validate(name); err != nil {
		return err
	}
	if r.opts.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.timeout)
		defer cancel()
	}
	if r.cmd.needs != needNothing {
		if r.backend, err = r.openBackend(ctx, name); err != nil {
			return err
		}
	}
	err = r.cmd.run(ctx, r, operands)
	if b, ok := r.backend.(*etcdBackend); ok && err != nil {
		err = b.explain(err)
	}
	return err
}

// help is "leasefence help [COMMAND]".
func (r *runner) help(args []string) error {
	switch len(args) {
	case 0:
		return writeManual(r.stdout)
	case 1:
		c := lookup(args[0])
		if c == nil {
			return usagef("", "help: unknown command %q (one of %s)", args[0], commandNames())
		}
		return writeCommandManual(r.stdout, c)
	}
	return usagef("", "help: takes at most one command, got %q", args)
}

// checkName validates an operand as leasecore does a lease name or scope,
// as a usage error naming the operand.
func checkName(cmd, what, v string) error {
	if err := backendkit.CheckName(cmd, what, v); err != nil {
		var ae *leasecore.ArgError
		if errors.As(err, &ae) {
			if ae.Value == "" {
				return usagef(cmd, "%s: invalid %s: %s", cmd, what, ae.Reason)
			}
			return usagef(cmd, "%s: invalid %s %s: %s", cmd, what, ae.Value, ae.Reason)
		}
		return usagef(cmd, "%s: %v", cmd, err)
	}
	return nil
}
