package command

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// options are every flag of the command line; a subcommand registers
// the common ones and its own.
type options struct {
	// Common to every command.
	backend                    string
	dsn, leaseDSN, resourceDSN string
	schema                     string
	endpoints, prefix          string
	// etcd's transport security and user, as etcdctl's global flags.
	cacert, cert, key  string
	user, password     string
	insecureSkipVerify bool
	timeout            time.Duration
	json, help         bool

	// A subcommand's own.
	limit     int
	rejected  bool
	since     string
	olderThan time.Duration
	yes       bool
	confirm   string
	scopes    stringList
	ttl       time.Duration
	holder    string
	force     bool
	lease     string

	set map[string]bool // flags given on the command line
}

// Defaults the manual states.
const (
	defaultTimeout       = 30 * time.Second
	defaultListLimit     = 1000
	defaultAttemptsLimit = 100
	defaultSince         = "24h"
	defaultBreakTTL      = 10 * time.Second
)

// newFlagSet returns a flag set with the common flags and the named
// subcommand flags, all writing into o. Errors are returned, never
// printed: Run prints them as usage errors.
func newFlagSet(cmd string, o *options, own []string) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	// Defaults are the values already parsed, so that a common flag given
	// before the subcommand survives the subcommand's parse.
	fs.StringVar(&o.backend, "backend", o.backend, "")
	fs.StringVar(&o.dsn, "dsn", o.dsn, "")
	fs.StringVar(&o.leaseDSN, "lease-dsn", o.leaseDSN, "")
	fs.StringVar(&o.resourceDSN, "resource-dsn", o.resourceDSN, "")
	fs.StringVar(&o.schema, "schema", o.schema, "")
	fs.StringVar(&o.endpoints, "endpoints", o.endpoints, "")
	fs.StringVar(&o.prefix, "prefix", o.prefix, "")
	fs.StringVar(&o.cacert, "cacert", o.cacert, "")
	fs.StringVar(&o.cert, "cert", o.cert, "")
	fs.StringVar(&o.key, "key", o.key, "")
	fs.StringVar(&o.user, "user", o.user, "")
	fs.StringVar(&o.password, "password", o.password, "")
	fs.BoolVar(&o.insecureSkipVerify, "insecure-skip-tls-verify", o.insecureSkipVerify, "")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "")
	fs.BoolVar(&o.json, "json", o.json, "")
	fs.BoolVar(&o.help, "help", o.help, "")
	fs.BoolVar(&o.help, "h", o.help, "")
	for _, name := range own {
		switch name {
		case "limit":
			def := defaultListLimit
			if cmd == "attempts" {
				def = defaultAttemptsLimit
			}
			fs.IntVar(&o.limit, name, def, "")
		case "rejected":
			fs.BoolVar(&o.rejected, name, false, "")
		case "since":
			fs.StringVar(&o.since, name, defaultSince, "")
		case "older-than":
			fs.DurationVar(&o.olderThan, name, 0, "")
		case "yes":
			fs.BoolVar(&o.yes, name, false, "")
		case "confirm":
			fs.StringVar(&o.confirm, name, "", "")
		case "scope":
			fs.Var(&o.scopes, name, "")
		case "ttl":
			fs.DurationVar(&o.ttl, name, defaultBreakTTL, "")
		case "holder", "writer":
			fs.StringVar(&o.holder, name, "", "")
		case "force":
			fs.BoolVar(&o.force, name, false, "")
		case "lease":
			fs.StringVar(&o.lease, name, "", "")
		default:
			panic("unknown flag " + name)
		}
	}
	return fs
}

// seen records which flags the command line gave, before or after the
// subcommand.
func (o *options) seen(sets ...*flag.FlagSet) {
	o.set = map[string]bool{}
	for _, fs := range sets {
		fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	}
}

// parseInterleaved parses fs's flags wherever they stand among the
// operands ("attempts SCOPE --rejected" as well as "attempts --rejected
// SCOPE"); everything after "--" is an operand.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(operands, rest...), nil
		}
		if len(rest) == 0 {
			return operands, nil
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
}

// validate checks the flags that need no backend to judge.
func (o *options) validate(cmd string) error {
	if o.timeout <= 0 {
		return usagef(cmd, "%s: --timeout %v: must be positive", cmd, o.timeout)
	}
	if o.set["ttl"] && o.ttl <= 0 {
		return usagef(cmd, "%s: --ttl %v: must be positive", cmd, o.ttl)
	}
	if o.set["older-than"] && o.olderThan <= 0 {
		return usagef(cmd, "%s: --older-than %v: must be positive", cmd, o.olderThan)
	}
	if o.set["holder"] || o.set["writer"] {
		flagName := "holder"
		if o.set["writer"] {
			flagName = "writer"
		}
		if err := checkName(cmd, "--"+flagName, o.holder); err != nil {
			return err
		}
	}
	if o.set["lease"] {
		if err := checkName(cmd, "--lease", o.lease); err != nil {
			return err
		}
	}
	for _, s := range o.scopes {
		if err := checkName(cmd, "--scope", s); err != nil {
			return err
		}
	}
	return nil
}

// stringList is a flag that may be given more than once.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// sinceTime parses --since: a duration back from now ("1h"), an RFC 3339
// time, or "all".
func sinceTime(cmd, v string, now time.Time) (time.Time, error) {
	if v == "all" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return time.Time{}, usagef(cmd, "%s: --since %q: a duration must be positive (or use all)", cmd, v)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, usagef(cmd, "%s: --since %q: want a duration (1h), an RFC 3339 time (2026-05-01T10:00:00Z) or all", cmd, v)
	}
	// Nothing is logged in the future; and etcd's attempt keys hold times
	// only up to the year 2262, so a far one would not even bound the read.
	if t.After(now) {
		return time.Time{}, usagef(cmd, "%s: --since %q: is in the future", cmd, v)
	}
	return t, nil
}

// checkLimit validates --limit against max.
func checkLimit(cmd string, limit, max int) error {
	if limit < 1 || limit > max {
		return usagef(cmd, "%s: --limit %d: must be 1 to %d", cmd, limit, max)
	}
	return nil
}

// operator is the default holder and writer of break and advance:
// recognisable in every log as an operator's, not an instance's.
func (r *runner) operator() string {
	if r.opts.holder != "" {
		return r.opts.holder
	}
	host, err := r.env.Hostname()
	if err != nil || host == "" {
		return "leasefence-operator"
	}
	return fmt.Sprintf("leasefence-operator@%s", host)
}
