//go:build !unix

package conformance

import (
	"context"
	"errors"
	"time"
)

var errNoSignals = errors.New("conformance: SIGSTOP/SIGCONT and /proc need a Unix system")

func freeze(int) error              { return errNoSignals }
func thaw(int) error                { return errNoSignals }
func procState(int) (string, error) { return "", errNoSignals }

func notifyContinued(context.Context, time.Duration) func() error {
	return func() error { return errNoSignals }
}
