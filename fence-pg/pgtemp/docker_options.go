package pgtemp

import (
	"errors"
	"fmt"
)

// The Docker provider: PostgreSQL in a container of a Docker engine, for machines without local
// server binaries. See the package documentation for when it is used.

// DefaultDockerImage is the image WithDocker("") and LEASEFENCE_PG_DOCKER=1 run: the official
// postgres image, pulled through the engine's registry if the engine does not have it yet.
const DefaultDockerImage = "postgres:17"

// LocalDockerImage is the image scripts/ensure-docker.sh builds with docker import from the
// PostgreSQL server binaries installed on the machine, for engines that reach no registry.
const LocalDockerImage = "leasefence/pgtemp:local"

// envDocker selects the Docker provider: "1" for DefaultDockerImage, anything else (but "0") is
// the image to run.
const envDocker = "LEASEFENCE_PG_DOCKER"

// ErrNoDocker means the Docker provider was selected but no Docker engine answered, or the image
// is not there and could not be pulled. pgtemp never falls back to another provider.
var ErrNoDocker = errors.New("pgtemp: Docker engine or image not available")

// WithDocker runs the cluster in a container of the Docker engine named by DOCKER_HOST (by
// default the local socket, /var/run/docker.sock) from image, or DefaultDockerImage if image is
// "". It takes precedence over LEASEFENCE_PG_URL and LEASEFENCE_PG_DOCKER, and cannot be combined
// with WithBinDir (the image brings its own binaries).
//
// The container shares the host's network (no bridge, no published port): postgres listens on
// 127.0.0.1 only, on a free port or WithPort's. Host networking needs Docker Engine on Linux, or
// Docker Desktop 4.34 or newer with "Enable host networking" turned on in its settings. Its data directory is a temp directory of this
// machine, bind-mounted at the same path, so DataDir and the server log next to it are readable
// as for a local cluster. The image must have a POSIX sh and initdb and postgres on its PATH or
// under /usr/lib/postgresql/*/bin, as the official postgres images and LocalDockerImage have; its
// entrypoint is not used. If the engine does not have the image, it is pulled (bounded only by
// Start's context, not by pgtemp's one-minute start limit).
func WithDocker(image string) Option {
	return func(c *config) {
		c.docker = true
		c.dockerImage = image
	}
}

// dockerChoice says whether the Docker provider runs this cluster, and with which image. The
// option wins over the environment; LEASEFENCE_PG_DOCKER together with LEASEFENCE_PG_URL is a
// contradiction reported as such rather than resolved silently.
func (c *config) dockerChoice() (use bool, image string, err error) {
	if c.docker {
		image = c.dockerImage
	} else {
		switch v := getenv(envDocker); v {
		case "", "0":
			return false, "", nil
		case "1":
			image = ""
		default:
			image = v
		}
		if getenv(envURL) != "" {
			return false, "", fmt.Errorf("pgtemp: both %s and %s are set: unset one (Docker provider or external server): %w",
				envDocker, envURL, ErrInvalidOption)
		}
	}
	if image == "" {
		image = DefaultDockerImage
	}
	if c.binDir != "" {
		return false, "", fmt.Errorf("pgtemp: WithBinDir(%q) with the Docker provider: the image %s brings its own binaries: %w",
			c.binDir, image, ErrInvalidOption)
	}
	return true, image, nil
}

// Container returns the name of the Docker container running the cluster ("docker logs NAME"),
// or "" if the Docker provider does not run it.
func (c *Cluster) Container() string {
	if c.docker == nil {
		return ""
	}
	return c.docker.containerName()
}
