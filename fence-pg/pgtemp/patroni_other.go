//go:build !unix

package pgtemp

import "context"

// PatroniCluster is three PostgreSQL members managed by Patroni. It needs Unix process control
// (signals, running as another user): on other systems StartPatroni reports ErrNotSupported.
type PatroniCluster struct{}

func errPatroniNotSupported() error {
	return &sentinelError{sentinel: ErrNotSupported, msg: "pgtemp: a Patroni cluster needs a Unix system"}
}

// StartPatroni reports ErrNotSupported outside Unix.
func StartPatroni(context.Context, bool, ...Option) (*PatroniCluster, error) {
	return nil, errPatroniNotSupported()
}

func (pc *PatroniCluster) Members() []PatroniMember { return nil }
func (pc *PatroniCluster) Version() string          { return "" }
func (pc *PatroniCluster) Synchronous() bool        { return false }
func (pc *PatroniCluster) DSN(string) string        { return "" }
func (pc *PatroniCluster) Leader(context.Context) (PatroniMember, error) {
	return PatroniMember{}, errPatroniNotSupported()
}
func (pc *PatroniCluster) WaitLeader(context.Context, PatroniMember) (PatroniMember, error) {
	return PatroniMember{}, errPatroniNotSupported()
}
func (pc *PatroniCluster) CreateDatabase(context.Context, string) error {
	return errPatroniNotSupported()
}
func (pc *PatroniCluster) HoldBackReplicas(context.Context) (string, error) {
	return "", errPatroniNotSupported()
}
func (pc *PatroniCluster) KillMember(PatroniMember) error    { return errPatroniNotSupported() }
func (pc *PatroniCluster) Stop() error                       { return nil }
func (pc *PatroniCluster) WaitHealthy(context.Context) error { return errPatroniNotSupported() }
func (pc *PatroniCluster) KillPostgres(PatroniMember) error  { return errPatroniNotSupported() }
func (pc *PatroniCluster) RestartMember(PatroniMember) error { return errPatroniNotSupported() }
func (pc *PatroniCluster) Switchover(context.Context) (PatroniMember, PatroniMember, error) {
	return PatroniMember{}, PatroniMember{}, errPatroniNotSupported()
}
