// Package pgsql holds every SQL statement fence-pg sends, so that the
// production stores, the negative controls and the conformance harness run
// the very same text (F2 must run the real acquire statement inside a long
// transaction, not a look-alike).
//
// Every statement binds its inputs as parameters ($1, $2, ...); nothing is
// ever spliced into SQL text. Parameters that PostgreSQL could not type from
// the statement alone carry an explicit cast, because lib/pq sends them
// untyped.
package pgsql
