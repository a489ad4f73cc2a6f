package pgstore

import "github.com/leasefence/leasefence/leasecore"

// WriteArgs returns the parameters $1..$5 that every write statement of
// package pgsql takes: scope, part, content, writer, token.
func WriteArgs(w leasecore.Write) []any {
	return []any{w.Scope, w.Part, w.Content, w.Writer, int64(w.Token)}
}
