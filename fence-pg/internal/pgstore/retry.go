package pgstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// serializationAttempts bounds how often RetrySerialization runs a
// statement: enough for every contender of a burst of concurrent acquires
// (each retry sees the winner's commit), few enough that a statement that
// keeps failing comes back as ErrUnavailable quickly.
const serializationAttempts = 10

// RetrySerialization runs stmt, which must send exactly one statement in
// its own implicit transaction on a pool (never inside a caller's
// transaction), and runs it again while it fails with a serialization
// failure, SQLSTATE 40001.
//
// The library's statements are written for Read Committed, PostgreSQL's
// default. A cluster, database or role may default to Repeatable Read or
// Serializable, and a single statement cannot change the level of the
// implicit transaction it runs in. At those levels a statement that finds
// a row updated by a transaction that committed after its snapshot was
// taken fails with 40001 where Read Committed would re-check the row
// (PostgreSQL docs §13.2.2, §13.2.3): a concurrent acquire, renew or floor
// update. The failed transaction did nothing, and a new one takes a new
// snapshot that sees the other transaction's commit, so running the
// statement again is both safe and what Read Committed would have done.
// The first retry is immediate (the conflicting transaction has committed
// by the time the error is reported); later ones wait a few random
// milliseconds, for the serialization failures of Serializable's
// predicate locks, which may involve transactions still running.
func RetrySerialization(ctx context.Context, stmt func() error) error {
	return retryWhile(ctx, stmt, IsSerializationFailure)
}

// RetryConflicts is RetrySerialization that also runs stmt again after a
// deadlock (SQLSTATE 40P01), for the holder-session statements, which lock
// a lease row and then session rows (see pgsql's Locks): the server aborts
// one transaction of a deadlock, whose statement did nothing, so running
// it again is safe.
func RetryConflicts(ctx context.Context, stmt func() error) error {
	return retryWhile(ctx, stmt, isConflict)
}

// isConflict reports the failures RetryConflicts runs a statement again
// after.
func isConflict(err error) bool { return IsSerializationFailure(err) || isDeadlock(err) }

// retryWhile runs stmt until it succeeds, fails otherwise than retryable
// says, ctx ends, or serializationAttempts runs are spent.
func retryWhile(ctx context.Context, stmt func() error, retryable func(error) bool) error {
	for attempt := 1; ; attempt++ {
		err := stmt()
		if err == nil || attempt == serializationAttempts || !retryable(err) || ctx.Err() != nil {
			return err
		}
		if attempt > 1 {
			t := time.NewTimer(time.Duration(rand.Int64N(int64(attempt) * int64(time.Millisecond))))
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// IsSerializationFailure reports whether err is the server's
// serialization_failure (SQLSTATE 40001), from either driver.
func IsSerializationFailure(err error) bool { return sqlState(err) == "40001" }

// isDeadlock reports whether err is the server's deadlock_detected
// (SQLSTATE 40P01), from either driver.
func isDeadlock(err error) bool { return sqlState(err) == "40P01" }

// sqlState is the SQLSTATE of the server error in err, "" for none.
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}
