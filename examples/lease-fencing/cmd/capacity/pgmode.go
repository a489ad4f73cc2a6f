package main

import fencepg "github.com/leasefence/leasefence/fence-pg"

// holderSessionsAvailable is the switch of the pg-sessions phase: true
// when fence-pg has holder sessions (fencepg.WithSharedLeases). With false the phase is reported as not run.
const holderSessionsAvailable = true

// pgStoreOptions returns the LeaseStore options of a mode: none for a lease
// row per name, WithSharedLeases for one session row per holder.
func pgStoreOptions(sessions bool) ([]fencepg.Option, error) {
	if !sessions {
		return nil, nil
	}
	return []fencepg.Option{fencepg.WithSharedLeases()}, nil
}
