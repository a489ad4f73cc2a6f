package fencepg

import (
	"context"
	_ "embed" // the schema files below

	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
)

// The schemas, embedded so that a binary migrates without its source tree.
var (
	//go:embed schema/lease.sql
	leaseSchema string
	//go:embed schema/resource.sql
	resourceSchema string
)

// Migrate creates the lease table in the lease database if it does not
// exist. It is idempotent, and two processes running it at once serialise
// on an advisory lock inside its transaction.
func (s *LeaseStore) Migrate(ctx context.Context) error {
	return pgstore.Migrate(ctx, s.db, pkg, leaseSchema)
}

// Migrate creates the resource tables (fence_floor, report_part,
// write_attempt) in the resource database if they do not exist. It is
// idempotent, and two processes running it at once serialise on an
// advisory lock inside its transaction.
func (r *Resource) Migrate(ctx context.Context) error {
	return r.fence.Migrate(ctx)
}
