//go:build !unix

package pgtemp

import (
	"context"
	"time"
)

// server stands in for the local provider, which needs Unix process control (process groups,
// signals, running as another user).
type server struct {
	dataDir string
	port    int
}

func startLocal(context.Context, config, func(string, ...any)) (*server, serverInfo, error) {
	return nil, serverInfo{}, &sentinelError{
		sentinel: ErrNotSupported,
		msg:      "pgtemp: local clusters need a Unix system; set LEASEFENCE_PG_URL to use an existing server",
	}
}

func (s *server) restartImmediate(context.Context) (time.Duration, error) {
	return 0, ErrNotSupported
}

func (s *server) shutdown() error { return nil }
