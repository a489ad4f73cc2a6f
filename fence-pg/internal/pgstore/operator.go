package pgstore

import (
	"context"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// RejectedAttemptsSince is AttemptsSince for rejected entries only: the
// filter runs in the server, so q.Limit counts rejections, however many
// accepted entries (leasecore.LogAll) lie between them.
func (r Reader) RejectedAttemptsSince(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error) {
	const op = "rejected attempts"
	if err := backendkit.CheckAttemptQuery(ctx, op, q); err != nil {
		return nil, err
	}
	return r.attempts(ctx, op, q.Scope, r.sql(pgsql.RejectedAttemptsSince), q.Scope, q.Since, q.Limit)
}
