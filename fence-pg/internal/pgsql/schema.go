package pgsql

import "strings"

// DefaultSchema is the PostgreSQL schema every statement of this package
// names its tables in. Keeping the library's tables in a schema of their
// own means they never collide with the user's (a table called lease in
// public, say). InSchema moves a statement to another schema.
const DefaultSchema = "leasefence"

// InSchema returns stmt with its tables (and function) in schema instead
// of DefaultSchema. schema must have passed fencepg's identifier check: a
// lower-case unquoted identifier needs no quoting.
func InSchema(stmt, schema string) string {
	if schema == DefaultSchema {
		return stmt
	}
	return strings.ReplaceAll(stmt, DefaultSchema+".", schema+".")
}

// Column is one column a table of the library must have.
type Column struct{ Table, Name, Type string }

// LeaseColumns, FenceColumns and ResourceColumns are what CheckSchema
// compares with the catalog (information_schema.columns.data_type
// spelling).
var (
	LeaseColumns = []Column{
		{"lease", "name", "text"}, {"lease", "holder", "text"}, {"lease", "token", "bigint"},
		{"lease", "expires_at", "timestamp with time zone"},
		{"lease", "session_id", "uuid"}, {"lease", "acquire_id", "bigint"},
	}
	// SessionColumns are the holder_session table's, which a store with
	// holder sessions also wants (CheckSchema with LeaseColumns). A store
	// without the mode does not ask for them: its role need not see the
	// table (information_schema shows only tables a role has a privilege
	// on), it reads sessions through holder_session_expiry only.
	SessionColumns = []Column{
		{"holder_session", "holder", "text"}, {"holder_session", "ttl_us", "bigint"},
		{"holder_session", "session_id", "uuid"}, {"holder_session", "expires_at", "timestamp with time zone"},
		{"holder_session", "generation", "bigint"},
	}
	// FenceColumns are a fence's tables'. A Fence does not ask for
	// report_part, which only the part store (Resource) writes: its role
	// need not see it.
	FenceColumns = []Column{
		{"fence_floor", "scope", "text"}, {"fence_floor", "max_token", "bigint"}, {"fence_floor", "token_space", "text"},
		{"write_attempt", "scope", "text"}, {"write_attempt", "id", "bigint"}, {"write_attempt", "part", "text"},
		{"write_attempt", "writer", "text"}, {"write_attempt", "token", "bigint"},
		{"write_attempt", "accepted", "boolean"}, {"write_attempt", "floor", "bigint"},
		{"write_attempt", "attempted_at", "timestamp with time zone"},
	}
	// ResourceColumns are the part store's: the fence's and report_part.
	ResourceColumns = append(FenceColumns[:len(FenceColumns):len(FenceColumns)],
		Column{"report_part", "scope", "text"}, Column{"report_part", "part", "text"}, Column{"report_part", "content", "text"},
		Column{"report_part", "writer", "text"}, Column{"report_part", "token", "bigint"},
		Column{"report_part", "written_at", "timestamp with time zone"},
	)
)

// Columns reads the columns of schema $1's tables: table, column, type.
const Columns = `SELECT table_name::text, column_name::text, data_type::text
  FROM information_schema.columns WHERE table_schema = $1::text`

// GuardTriggers are the token-space guards the schema files create, per
// table (see refuse_token_reset in schema/guard.sql).
var GuardTriggers = map[string][]string{
	"lease":       {"lease_never_deleted", "lease_never_truncated", "lease_token_only_grows"},
	"fence_floor": {"floor_never_deleted", "floor_never_truncated", "floor_only_grows"},
}

// SessionDetachTrigger is the trigger on lease that counts the names
// leaving a holder session (schema/lease.sql); RenewAll's fast path with
// holder sessions is only sound with it, so CheckSchema wants it whenever
// it wants the holder_session table.
const SessionDetachTrigger = "lease_detached_from_session"

// Triggers lists the user triggers of table $2 in schema $1, sorted and
// comma-separated.
const Triggers = `SELECT coalesce(string_agg(t.tgname::text, ',' ORDER BY t.tgname), '')
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1::text AND c.relname = $2::text AND NOT t.tgisinternal`

// LeaseFunctions and ResourceFunctions are the functions of each schema
// file that CheckSchema wants and Preflight checks EXECUTE on.
var (
	LeaseFunctions    = []string{"token_space", "holder_session_expiry"}
	ResourceFunctions = []string{"fence_reject"}
)

// HasFunction reports whether schema $1 has a function named $2.
const HasFunction = `SELECT EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = $1::text AND p.proname = $2::text)`
