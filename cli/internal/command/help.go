package command

import (
	"fmt"
	"io"
	"strings"
)

// manualOrder is the order of the commands in the manual.
var manualOrder = []string{"status", "list", "floors", "attempts", "advance", "break", "migrate", "schema", "prune-attempts"}

// flagDocs documents every subcommand flag, as the manual shows it.
var flagDocs = map[string]string{
	"limit": `--limit N
    At most N entries (list, status, floors: default 1000, at most 10000; attempts:
    default 100, at most 10000). A note on stderr says when there may be more.`,
	"rejected": `--rejected
    Only rejected attempts: the stale writes the fence turned away.`,
	"since": `--since DURATION | TIME | all
    Entries logged at or after DURATION ago (1h, 30m), or at or after an RFC 3339
    TIME (2026-05-01T10:00:00Z), or all of them. Default 24h.`,
	"older-than": `--older-than DURATION
    Required. Delete entries logged more than DURATION ago (720h for 30 days).`,
	"yes": `--yes
    Confirm the break without repeating the name.`,
	"confirm": `--confirm NAME
    Confirm the break by repeating the lease's name; another name is a usage error.`,
	"scope": `--scope SCOPE
    A scope the lease fences; repeat it for each. Required.`,
	"ttl": `--ttl DURATION
    The TTL of the operator's short holding period, which break releases at once;
    it only matters if the command dies before the release. Default 10s (etcd: whole
    seconds).`,
	"holder": `--holder ID
    The operator's holder id: the holder of the short holding period, and the writer
    of each scope's advance in its attempt log. Default leasefence-operator@HOSTNAME.`,
	"writer": `--writer ID
    The writer the scope's attempt log records for this advance. Default
    leasefence-operator@HOSTNAME.`,
	"lease": `--lease NAME
    The lease whose tokens fence SCOPE. Default: the lease named like SCOPE (on
    PostgreSQL not checked when no such lease exists).`,
	"force": `--force
    Skip the check of TOKEN against the lease's tokens.`,
}

const manualHead = `NAME
    leasefence - inspect and operate leasefence's leases and fences on PostgreSQL or etcd

SYNOPSIS
    leasefence [COMMON OPTIONS] COMMAND [OPTIONS] [OPERANDS]
    leasefence help [COMMAND]
    leasefence COMMAND --help

DESCRIPTION
    leasefence shows who holds each lease, each scope's floor (the largest token its
    fence accepted) and the stale writes the fence rejected, and lets an operator fence
    off a holder now: raise a floor (advance), or end a holding period and fence its
    holder off in one command (break). It also creates or prints the PostgreSQL schema.

    It speaks to one backend: PostgreSQL (the lease database and the resource database
    that holds the fence, which may be one database) or etcd (one cluster, one key
    prefix). The backend is --backend, or else inferred from the connection flags given
    (--dsn, --lease-dsn, --resource-dsn, --schema: PostgreSQL; --endpoints, --prefix
    and the TLS and user flags: etcd), or else from the environment (PG* or
    ETCDCTL_ENDPOINTS). Flags of the other backend are a usage error.

    Times left are by the server's clock, never this machine's. Tokens only grow: no
    command lowers a token or a floor, or deletes a lease. The operator's own advances
    (advance, break) are logged in the scopes' attempt logs, as accepted attempts of
    their writer (--writer, --holder).

    Every command takes --json: one JSON document on stdout, for machines. Errors and
    notes go to stderr.

COMMANDS
`

const manualCommon = `COMMON OPTIONS
    Accepted before or after COMMAND.

    --backend postgres | etcd
        The backend; inferred when not given (see DESCRIPTION).
    --dsn DSN
        PostgreSQL: the database of both the leases and the fence (a URL or key=value
        DSN, as libpq takes it). Over a network, verify the server:
        sslmode=verify-full sslrootcert=CA.pem checks its certificate against the CA
        and its name against the DSN's host (an IP address host needs an IP address
        SAN); the default, prefer, checks neither. sslcert and sslkey give a client
        certificate.
    --lease-dsn DSN, --resource-dsn DSN
        PostgreSQL: the lease database and the resource (fence) database, when they
        differ. Each defaults to --dsn, then to the PG* environment.
    --schema NAME
        PostgreSQL: the schema of the library's tables (default leasefence), as the
        applications' fencepg.WithSchema.
    --endpoints HOST:PORT[,...]
        etcd: the cluster's endpoints. Default ETCDCTL_ENDPOINTS, then 127.0.0.1:2379.
    --prefix PREFIX
        etcd: the key prefix of the applications' fenceetcd.WithPrefix (default
        /leasefence).
    --cacert FILE
        etcd: verify the server's certificate with the CA certificates in FILE (PEM)
        rather than the system's. Default ETCDCTL_CACERT.
    --cert FILE, --key FILE
        etcd: the client certificate and its private key (PEM), for a server that
        requires one (etcd --client-cert-auth). With authentication on, a request
        that names no user acts as the user the certificate's Common Name names.
        Default ETCDCTL_CERT, ETCDCTL_KEY.
    --user NAME[:PASSWORD], --password PASSWORD
        etcd: log in as NAME. The password is --password, else ETCDCTL_PASSWORD, else
        the part of --user after the colon; leasefence does not prompt. Default
        ETCDCTL_USER. Prefer ETCDCTL_PASSWORD to --password: other users of the machine
        can read a command line.
    --insecure-skip-tls-verify
        etcd: TLS without verifying the server's certificate, for a test server only:
        whoever is on the path reads and changes what is sent. Not with --cacert.
        Default ETCDCTL_INSECURE_SKIP_TLS_VERIFY.
        TLS is on when any of --cacert, --cert, --key, --insecure-skip-tls-verify (or
        their variables) is given, or an endpoint is https://; an http:// endpoint
        with them is a usage error. The names are etcdctl's.
    --timeout DURATION
        Give up after DURATION (default 30s).
    --json
        Write the result as JSON.
    -h, --help
        Show this manual, or a command's section.

ENVIRONMENT
    PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSERVICE, PGSSLMODE,
    PGSSLROOTCERT, PGSSLCERT, PGSSLKEY, ...
        libpq's variables, read (through pgx) for a PostgreSQL database that no DSN
        flag names; any of PGHOST, PGHOSTADDR, PGPORT, PGDATABASE, PGUSER, PGSERVICE
        set selects the PostgreSQL backend when no flag does.
    ETCDCTL_ENDPOINTS
        etcd's endpoints, comma-separated, when --endpoints is not given; set, it
        selects the etcd backend when no flag does.
    ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER, ETCDCTL_PASSWORD,
    ETCDCTL_INSECURE_SKIP_TLS_VERIFY
        etcd's TLS files and user, as etcdctl reads them, each when its flag is not
        given. They do not select a backend.

EXIT STATUS
    0   The command did what it was asked (advance: the floor is at TOKEN or above).
    1   An error: a server unreachable, tables missing, a refused advance, a break
        that could not advance every scope. Stderr says what was done and what to run.
    2   Usage: an unknown command or flag, a bad operand or value. Stderr names it.
        Nothing was sent to a server, nothing was written.
    3   Warnings: floors found a floor above every token its lease can have issued
        (a token-space mix-up), or break found such a scope.

EXAMPLES
    Who holds what, by the database clock:
        export PGHOST=db.internal PGUSER=ops PGDATABASE=leases
        leasefence status
        leasefence status nightly-invoices --json

    Floors of an application whose leases and data live in two databases, checking
    scope invoices against the lease nightly-invoices:
        leasefence floors --lease-dsn postgres://ops@db/leases \
            --resource-dsn postgres://ops@db/app invoices=nightly-invoices

    The stale writes rejected in the last hour, on etcd:
        ETCDCTL_ENDPOINTS=10.0.0.5:2379 leasefence attempts invoices --rejected --since 1h

    The same on an etcd with client TLS and authentication (the password from the
    environment, not the command line):
        export ETCDCTL_CACERT=/etc/etcd/ca.pem ETCDCTL_CERT=ops.pem ETCDCTL_KEY=ops-key.pem
        export ETCDCTL_USER=ops ETCDCTL_PASSWORD=...
        leasefence attempts invoices --rejected --endpoints https://10.0.0.5:2379

    Floors on PostgreSQL over verified SSL:
        leasefence floors --dsn 'host=db.internal dbname=app user=ops sslmode=verify-full sslrootcert=/etc/ssl/db-ca.pem'

    Fence off every token below the current holder's 42:
        leasefence advance invoices 42 --lease nightly-invoices

    End a wedged holder's period now and fence it off:
        leasefence break nightly-invoices --scope invoices --confirm nightly-invoices

    Create the tables, or hand the DDL to a migration tool:
        leasefence migrate --dsn postgres://owner@db/app
        leasefence schema --schema jobs > leasefence.sql

    Keep 30 days of attempt log:
        leasefence prune-attempts --older-than 720h --dsn postgres://ops@db/app
`

// writeManual writes the whole manual.
func writeManual(w io.Writer) error {
	var b strings.Builder
	b.WriteString(manualHead)
	for _, name := range manualOrder {
		c := lookup(name)
		fmt.Fprintf(&b, "    %-15s %s\n", c.name, c.summary)
	}
	b.WriteString("    help            this manual, or one command's section\n\n")
	for _, name := range manualOrder {
		writeSection(&b, lookup(name), "    ")
	}
	b.WriteString(manualCommon)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeCommandManual writes one command's section and the common parts.
func writeCommandManual(w io.Writer, c *command) error {
	var b strings.Builder
	fmt.Fprintf(&b, "NAME\n    leasefence %s - %s\n\nSYNOPSIS\n    %s\n\nDESCRIPTION\n", c.name, c.summary, synopsis(c))
	b.WriteString(indent(c.doc, "    "))
	b.WriteString("\n\nOPTIONS\n")
	if len(c.flags) == 0 {
		b.WriteString("    Only the common options (leasefence --help).\n")
	}
	for _, f := range c.flags {
		b.WriteString(indent(flagDocs[f], "    "))
		b.WriteString("\n")
	}
	b.WriteString("    --json, and the connection options: see leasefence --help (COMMON OPTIONS,\n    ENVIRONMENT, EXIT STATUS, EXAMPLES).\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func writeSection(b *strings.Builder, c *command, in string) {
	fmt.Fprintf(b, "%s%s\n", in, synopsis(c))
	b.WriteString(indent(c.doc, in+"    "))
	b.WriteString("\n")
	for _, f := range c.flags {
		b.WriteString(indent(flagDocs[f], in+"    "))
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

func synopsis(c *command) string {
	s := "leasefence " + c.name
	for _, f := range c.flags {
		switch f {
		case "scope", "yes", "confirm", "older-than":
			continue // in the operands' synopsis
		}
		first, _, _ := strings.Cut(flagDocs[f], "\n")
		s += " [" + first + "]"
	}
	if c.args != "" {
		s += " " + c.args
	}
	return s
}

func indent(text, in string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = in + l
		}
	}
	return strings.Join(lines, "\n")
}
