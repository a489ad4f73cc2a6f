//go:build !unix

package pgtemp

import (
	"context"
	"time"
)

// dockerServer stands in for the Docker provider, which runs the container as the data
// directory's Unix owner and bind-mounts it at the same path.
type dockerServer struct{}

func startDocker(context.Context, config, string, func(string, ...any)) (*dockerServer, serverInfo, error) {
	return nil, serverInfo{}, &sentinelError{
		sentinel: ErrNotSupported,
		msg:      "pgtemp: the Docker provider needs a Unix system; set LEASEFENCE_PG_URL to use an existing server",
	}
}

func (d *dockerServer) port() int             { return 0 }
func (d *dockerServer) dataDirPath() string   { return "" }
func (d *dockerServer) containerName() string { return "" }
func (d *dockerServer) restartImmediate(context.Context) (time.Duration, error) {
	return 0, ErrNotSupported
}
func (d *dockerServer) shutdown() error { return nil }
