//go:build !unix

package pgbouncertest

import (
	"errors"
	"time"
)

type process struct {
	done    chan struct{}
	waitErr error
}

type osUser struct{}

var errNotSupported = errors.New("pgbouncertest: starting pgbouncer needs a Unix system")

func (b *Bouncer) spawn() (*process, int64, error) { return nil, 0, errNotSupported }

func (p *process) stop(time.Duration) string { return "not running" }

func serverUser() (*osUser, error) { return nil, errNotSupported }

func (b *Bouncer) chownAll() error { return nil }

func freePort() (int, error) { return 0, errNotSupported }
