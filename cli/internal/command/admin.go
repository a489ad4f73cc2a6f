package command

import (
	"context"
	"fmt"
	"strings"

	fencepg "github.com/leasefence/leasefence/fence-pg"
)

func init() {
	commands = append(commands,
		&command{
			name: "migrate", needs: needBoth,
			summary: "create the tables (PostgreSQL; nothing to do on etcd)",
			doc: `Creates the lease table in the lease database and the fence's tables in the
resource database (the same database when one DSN serves both), in the schema
--schema, if they do not exist; then checks them. Idempotent; safe to run from
several processes at once. Run it as the tables' owner. On etcd there is nothing to
create: keys are written on first use.`,
			run: runMigrate,
		},
		&command{
			name: "schema", args: "[lease | resource]", needs: needNothing,
			summary: "print the DDL for your own migration tool (PostgreSQL)",
			doc: `Prints the DDL that migrate runs — the lease table, then the fence's tables —
in the schema --schema, for a migration tool of your own; lease or resource prints
one part. Connects to nothing. The grants a runtime role needs, and which role
runs migrate, are in docs/security.md (and fence-pg's LeaseDDL and ResourceDDL).`,
			run: runSchema,
		},
	)
}

func runMigrate(ctx context.Context, r *runner, operands []string) error {
	if len(operands) > 0 {
		return usagef("migrate", "migrate: takes no operands, got %q", operands)
	}
	done, err := r.backend.migrate(ctx)
	if r.opts.json && err == nil {
		return writeJSON(r.stdout, struct {
			Backend string   `json:"backend"`
			Done    []string `json:"done"`
		}{r.backend.kind(), done})
	}
	for _, d := range done {
		fmt.Fprintln(r.stdout, d)
	}
	return err
}

func runSchema(_ context.Context, r *runner, operands []string) error {
	const cmd = "schema"
	o := &r.opts
	if o.backend == backendEtcd || o.set["endpoints"] || o.set["prefix"] {
		return usagef(cmd, "schema: etcd has no DDL (keys are written on first use)")
	}
	if o.backend != "" && o.backend != "postgres" && o.backend != "postgresql" && o.backend != "pg" {
		return usagef(cmd, "schema: --backend %q: must be postgres or etcd", o.backend)
	}
	part := "all"
	switch len(operands) {
	case 0:
	case 1:
		part = operands[0]
		if part != "lease" && part != "resource" {
			return usagef(cmd, "schema: unknown part %q: want lease or resource", part)
		}
	default:
		return usagef(cmd, "schema: takes at most one operand (lease or resource), got %q", operands)
	}
	schema := fencepg.DefaultSchema
	if o.set["schema"] {
		schema = o.schema
	}
	leaseDDL, err := fencepg.LeaseDDL(schema)
	if err != nil {
		return err
	}
	resourceDDL, err := fencepg.ResourceDDL(schema)
	if err != nil {
		return err
	}
	if o.json {
		out := struct {
			Schema   string `json:"schema"`
			Lease    string `json:"lease_ddl,omitempty"`
			Resource string `json:"resource_ddl,omitempty"`
		}{Schema: schema}
		if part != "resource" {
			out.Lease = leaseDDL
		}
		if part != "lease" {
			out.Resource = resourceDDL
		}
		return writeJSON(r.stdout, out)
	}
	if part != "resource" {
		fmt.Fprintf(r.stdout, "-- leasefence: the lease database (schema %s)\n%s\n", schema, strings.TrimRight(leaseDDL, "\n"))
	}
	if part == "all" {
		fmt.Fprintln(r.stdout)
	}
	if part != "lease" {
		fmt.Fprintf(r.stdout, "-- leasefence: the resource database, next to the data it fences (schema %s)\n%s\n", schema, strings.TrimRight(resourceDDL, "\n"))
	}
	return nil
}
