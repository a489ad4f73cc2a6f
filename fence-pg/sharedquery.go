package fencepg

import (
	"context"
	"sync/atomic"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
)

// queryShared sends stmt, with arg (a JSON array of the callers' inputs)
// as its one parameter, once for several callers whose contexts are ctxs:
// the statement lives while any of them waits (whileAnyWaits), a conflict
// sends it again (pgstore.RetryConflicts), and the keys scan reads from its
// rows come back as a set, which says whose input the statement carried
// out.
func queryShared[K comparable](db dbx.Querier, ctxs []context.Context, stmt string, arg []byte,
	scan func(dbx.Rows) (K, error)) (map[K]bool, error) {
	ctx, release := whileAnyWaits(ctxs)
	defer release()
	got := make(map[K]bool, len(ctxs))
	err := pgstore.RetryConflicts(ctx, func() error {
		clear(got)
		rows, err := db.Query(ctx, stmt, string(arg))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			k, err := scan(rows)
			if err != nil {
				return err
			}
			got[k] = true
		}
		return rows.Err()
	})
	return got, err
}

// whileAnyWaits returns a context for a statement sent on behalf of several
// callers (a batch of renewals or of writes): it is cancelled once every
// one of ctxs has ended, i.e. once no caller waits for the answer any
// more, or when release is called. Call release when the statement is
// done.
func whileAnyWaits(ctxs []context.Context) (ctx context.Context, release func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(ctxs)))
	stops := make([]func() bool, 0, len(ctxs))
	for _, c := range ctxs {
		stops = append(stops, context.AfterFunc(c, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
