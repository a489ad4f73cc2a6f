// Command leasefence operates leasefence's leases and fences on PostgreSQL
// or etcd: who holds a lease, each scope's floor, the stale writes the
// fence rejected, and the operator's interventions (advance a floor, break
// a lease). Run "leasefence --help" for the manual.
package main

import (
	"os"

	"github.com/leasefence/leasefence/cli/internal/command"
)

func main() { os.Exit(command.Main()) }
