//go:build !unix

package pgtemp

import (
	"context"
	"time"
)

// StandbyName is the standby's application_name on its replication connection.
const StandbyName = "pgtemp_standby"

// StandbyPair is a primary and a streaming standby. It needs Unix process control (signals,
// running as another user): on other systems StartStandbyPair reports ErrNotSupported.
type StandbyPair struct{}

func errPairNotSupported() error {
	return &sentinelError{sentinel: ErrNotSupported, msg: "pgtemp: a standby pair needs a Unix system"}
}

// StartStandbyPair reports ErrNotSupported outside Unix.
func StartStandbyPair(context.Context, bool, ...Option) (*StandbyPair, error) {
	return nil, errPairNotSupported()
}

func (p *StandbyPair) Primary() *Cluster { return nil }
func (p *StandbyPair) Standby() *Cluster { return nil }
func (p *StandbyPair) Synchronous() bool { return false }
func (p *StandbyPair) FreezeStandby(context.Context) (string, error) {
	return "", errPairNotSupported()
}
func (p *StandbyPair) ThawStandby() error                 { return errPairNotSupported() }
func (p *StandbyPair) CrashPrimary(context.Context) error { return errPairNotSupported() }
func (p *StandbyPair) Promote(context.Context) (time.Duration, error) {
	return 0, errPairNotSupported()
}
func (p *StandbyPair) Stop() error { return nil }

// BinDir returns "": outside Unix pgtemp runs no local cluster.
func (c *Cluster) BinDir() string { return "" }
