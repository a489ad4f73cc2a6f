// Package pgstore is the behaviour that fence-pg's production stores
// (package fencepg), its negative controls (pgcontrol) and its conformance
// harness (pgconformance) share: error mapping, the resource readers,
// migrations and the acquire statement's runner. It exists so that none of
// them copies another's code; the SQL text itself lives in package pgsql.
package pgstore
