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
	for attempt := 1; ; attempt++ {
		err := stmt()
		if err == nil || attempt == serializationAttempts || !IsSerializationFailure(err) || ctx.Err() != nil {
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
func IsSerializationFailure(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "40001"
}
