// Package tests holds the metrics module's tests that need a real server
// and real processes: a holder frozen with SIGSTOP whose registry is
// scraped over HTTP. It is a module of its own so that the metrics module
// requires nothing of the test servers (docs/modules.md).
package tests
