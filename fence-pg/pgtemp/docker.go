//go:build unix

package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// dockerServer is a cluster in a container. The container shares the host's network, so
// postgres binds 127.0.0.1 of this machine, and its data directory is a temp directory of this
// machine bind-mounted at the same path, so the files, the server log and what postgres reports
// as its data_directory are the same inside and out.
type dockerServer struct {
	// files is the local provider's layout (temp dir, data dir, postgres.log, port, settings, OS
	// user), so both providers run postgres with the same arguments and check it the same way.
	files server

	client   *dc.Client
	endpoint string
	image    string
	uid, gid uint32
	name     string // container name: the temp directory's base name
	id       string // container ID; "" while no container exists
}

// Labels on every container pgtemp creates, so a later Start can remove the containers of a
// test binary that was killed before its Stop (nothing else stops them: unlike a child process,
// a container does not die with its parent).
const (
	dockerLabel     = "leasefence.pgtemp"
	dockerLabelPID  = "leasefence.pgtemp.pid"
	dockerLabelHost = "leasefence.pgtemp.host"
	dockerLabelDir  = "leasefence.pgtemp.dir"

	dockerDirPrefix = "pgtemp-docker-"
)

// dockerEntrypoint runs in the container as the data directory's owner: initdb on the first
// start (same options as the local provider's, no --no-sync), then postgres as PID 1, so that
// signals sent to the container reach the postmaster. A later start of the same container finds
// PG_VERSION and goes straight to postgres, which recovers from the WAL. Output of both goes to
// postgres.log next to the data directory; "$@" are the postgres arguments.
const dockerEntrypoint = `
if ! command -v postgres >/dev/null 2>&1; then
	for d in /usr/lib/postgresql/*/bin /usr/local/pgsql/bin; do
		if [ -x "$d/postgres" ]; then PATH="$d:$PATH"; fi
	done
fi
if [ ! -s "$PGTEMP_DATA/PG_VERSION" ]; then
	echo "pgtemp: initdb in container" >>"$PGTEMP_LOG"
	initdb -D "$PGTEMP_DATA" -U postgres --auth=trust -E UTF8 --locale=C >>"$PGTEMP_LOG" 2>&1 || {
		echo "pgtemp: initdb failed" >>"$PGTEMP_LOG"; exit 3; }
fi
exec postgres "$@" >>"$PGTEMP_LOG" 2>&1
`

func startDocker(ctx context.Context, cfg config, image string, logf func(string, ...any)) (*dockerServer, serverInfo, error) {
	t0 := time.Now()
	if cfg.port != 0 {
		if err := checkPortFree(cfg.port); err != nil {
			return nil, serverInfo{}, err
		}
	}
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, serverInfo{}, noDockerError("no Docker client: %v", err)
	}
	d := &dockerServer{client: pool.Client, endpoint: pool.Client.Endpoint(), image: image}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = d.client.PingWithContext(pingCtx)
	cancel()
	if err != nil {
		return nil, serverInfo{}, noDockerError("no Docker engine answers at %s (set DOCKER_HOST, or start one: "+
			"scripts/ensure-docker.sh does on Debian/Ubuntu as root): %v", d.endpoint, err)
	}
	d.sweep(ctx, logf)
	if err := d.ensureImage(ctx, logf); err != nil {
		return nil, serverInfo{}, err
	}

	// The pull above is bounded by the caller only; the start proper by startTimeout.
	ctx, cancel = context.WithTimeout(ctx, startTimeout)
	defer cancel()
	u, err := serverUser()
	if err != nil {
		return nil, serverInfo{}, err
	}
	if u != nil {
		if err := checkTraversable(os.TempDir(), u); err != nil {
			return nil, serverInfo{}, err
		}
		d.uid, d.gid = u.uid, u.gid
	} else {
		d.uid, d.gid = uint32(os.Getuid()), uint32(os.Getgid())
	}
	tmp, err := os.MkdirTemp("", dockerDirPrefix)
	if err != nil {
		return nil, serverInfo{}, fmt.Errorf("pgtemp: %w", err)
	}
	if abs, err := filepath.Abs(tmp); err == nil {
		tmp = abs
	}
	d.name = filepath.Base(tmp)
	d.files = server{
		user:     u,
		tmpDir:   tmp,
		dataDir:  filepath.Join(tmp, "data"),
		logPath:  filepath.Join(tmp, "postgres.log"),
		logf:     logf,
		settings: cfg.settings,
	}
	ok := false
	defer func() {
		if !ok {
			d.discard()
		}
	}()
	if err := d.files.prepareDirs(); err != nil {
		return nil, serverInfo{}, err
	}
	if err := d.writeIdentity(); err != nil {
		return nil, serverInfo{}, err
	}
	info, err := d.startOnPort(ctx, cfg.port)
	if err != nil {
		return nil, serverInfo{}, err
	}
	ok = true
	logf("started PostgreSQL %s in container %s (image %s, engine %s) on %s:%d in %.1fs (data dir %s)",
		info.version, d.name, d.image, d.endpoint, loopback, d.files.port, time.Since(t0).Seconds(), d.files.dataDir)
	return d, info, nil
}

func noDockerError(format string, args ...any) error {
	return &sentinelError{sentinel: ErrNoDocker, msg: "pgtemp: Docker provider: " + fmt.Sprintf(format, args...)}
}

func (d *dockerServer) port() int           { return d.files.port }
func (d *dockerServer) dataDirPath() string { return d.files.dataDir }
func (d *dockerServer) containerName() string {
	return d.name
}

// ensureImage pulls the image if the engine does not have it. No pull happens for an image the
// engine has, so an engine without a registry works with LocalDockerImage.
func (d *dockerServer) ensureImage(ctx context.Context, logf func(string, ...any)) error {
	_, err := d.client.InspectImage(d.image)
	if err == nil {
		return nil
	}
	if !errors.Is(err, dc.ErrNoSuchImage) {
		return noDockerError("inspecting image %s: %v", d.image, err)
	}
	t0 := time.Now()
	logf("image %s is not in the Docker engine: pulling it", d.image)
	repo, tag := splitImage(d.image)
	if err := d.client.PullImage(dc.PullImageOptions{Repository: repo, Tag: tag, Context: ctx}, dc.AuthConfiguration{}); err != nil {
		return noDockerError("image %s is not in the Docker engine and pulling it failed: %v "+
			"(without a registry, build %s from the local PostgreSQL binaries with scripts/ensure-docker.sh)",
			d.image, err, LocalDockerImage)
	}
	logf("pulled %s in %.1fs", d.image, time.Since(t0).Seconds())
	return nil
}

// splitImage splits "name:tag" or "name@digest" for the pull API; a name alone means "latest".
func splitImage(ref string) (repo, tag string) {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		return ref[:i], ref[i+1:]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, "latest"
}

// writeIdentity writes the passwd and group files mounted over the image's: initdb looks its
// user up by uid, and the container runs as the owner of the data directory (this process's
// user, or "postgres" when running as root), whom the image does not know.
func (d *dockerServer) writeIdentity() error {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\npostgres:x:%d:%d:pgtemp:%s:/bin/sh\n", d.uid, d.gid, d.files.tmpDir)
	group := "root:x:0:\n"
	if d.gid != 0 {
		group += fmt.Sprintf("postgres:x:%d:\n", d.gid)
	}
	for name, content := range map[string]string{"passwd": passwd, "group": group} {
		if err := os.WriteFile(filepath.Join(d.files.tmpDir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("pgtemp: %w", err)
		}
	}
	return nil
}

// startOnPort is the local provider's port loop: a kernel-picked port taken before postgres
// binds it is replaced by another; a port the caller chose never is.
func (d *dockerServer) startOnPort(ctx context.Context, fixed int) (serverInfo, error) {
	for attempt := 1; ; attempt++ {
		d.files.port = fixed
		if fixed == 0 {
			port, err := freePort()
			if err != nil {
				return serverInfo{}, err
			}
			d.files.port = port
		}
		info, err := d.createAndWait(ctx)
		if err == nil || fixed != 0 || attempt == autoPortAttempts || !errors.Is(err, ErrPortInUse) {
			return info, err
		}
		d.files.logf("port %d was taken before postgres could bind it; trying another", d.files.port)
	}
}

// createAndWait creates the container for the current port (replacing one of an earlier
// attempt: the port is part of its command), starts it and waits until postgres accepts
// connections.
func (d *dockerServer) createAndWait(ctx context.Context) (serverInfo, error) {
	if err := d.removeContainer(); err != nil {
		return serverInfo{}, err
	}
	tmp := d.files.tmpDir
	d.files.logf("creating container %s from %s: postgres on %s:%d, host network, as uid %d, data dir %s bind-mounted",
		d.name, d.image, loopback, d.files.port, d.uid, tmp)
	c, err := d.client.CreateContainer(dc.CreateContainerOptions{
		Context: ctx,
		Name:    d.name,
		Config: &dc.Config{
			Image:      d.image,
			User:       fmt.Sprintf("%d:%d", d.uid, d.gid),
			Entrypoint: []string{"/bin/sh", "-c", dockerEntrypoint, "pgtemp"},
			Cmd:        d.files.serverArgs(),
			Env: []string{
				"PGTEMP_DATA=" + d.files.dataDir,
				"PGTEMP_LOG=" + d.files.logPath,
				"LC_ALL=C", // English server messages, as for the local provider
			},
			WorkingDir: tmp,
			StopSignal: "SIGINT", // a docker stop by hand is a fast shutdown
			Labels: map[string]string{
				dockerLabel:     "1",
				dockerLabelPID:  strconv.Itoa(os.Getpid()),
				dockerLabelHost: hostname(),
				dockerLabelDir:  tmp,
			},
		},
		HostConfig: &dc.HostConfig{
			// The host's network namespace: postgres binds 127.0.0.1 of this machine and no
			// port is published, so no bridge or private-range address is involved.
			NetworkMode: "host",
			Binds: []string{
				tmp + ":" + tmp,
				filepath.Join(tmp, "passwd") + ":/etc/passwd:ro",
				filepath.Join(tmp, "group") + ":/etc/group:ro",
			},
			ShmSize:       256 << 20, // dynamic shared memory; Docker's default /dev/shm is 64 MiB
			RestartPolicy: dc.NeverRestart(),
		},
	})
	if err != nil {
		return serverInfo{}, noDockerError("creating a container from %s: %v", d.image, err)
	}
	d.id = c.ID
	offset := logSize(d.files.logPath)
	if err := d.client.StartContainerWithContext(d.id, nil, ctx); err != nil {
		return serverInfo{}, fmt.Errorf("pgtemp: starting container %s: %w", d.name, err)
	}
	info, _, err := d.waitReady(ctx, offset)
	return info, err
}

// waitReady polls with real connections, as the local provider does, and watches the container:
// once it has exited there is nothing to wait for.
func (d *dockerServer) waitReady(ctx context.Context, logOffset int64) (serverInfo, time.Time, error) {
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", superuser, loopback, d.files.port, maintenanceDB)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(attemptCtx, dsn)
		cancel()
		if err == nil {
			readyAt := time.Now()
			info, err := d.files.checkServer(ctx, conn)
			closeConn(conn)
			return info, readyAt, err
		}
		lastErr = err

		st, err := d.state(ctx)
		if err != nil {
			if ctx.Err() == nil {
				return serverInfo{}, time.Time{}, fmt.Errorf("pgtemp: container %s: %w", d.name, err)
			}
		} else if !st.Running {
			return serverInfo{}, time.Time{}, d.exitedError(st, logOffset)
		}
		select {
		case <-ctx.Done():
			return serverInfo{}, time.Time{}, fmt.Errorf(
				"pgtemp: postgres in container %s on %s:%d not ready (last attempt: %v): %w; last lines of %s:\n%s",
				d.name, loopback, d.files.port, lastErr, ctx.Err(), d.files.logPath, lastLines(d.files.logSince(logOffset), 20))
		case <-tick.C:
		}
	}
}

func (d *dockerServer) state(ctx context.Context) (dc.State, error) {
	c, err := d.client.InspectContainerWithContext(d.id, ctx)
	if err != nil {
		return dc.State{}, err
	}
	return c.State, nil
}

// exitedError explains an exit during startup with the server log, and the container's own
// output if the entrypoint could not even write that. A failed bind is ErrPortInUse.
func (d *dockerServer) exitedError(st dc.State, logOffset int64) error {
	out := d.files.logSince(logOffset)
	detail := fmt.Sprintf("postgres in container %s exited during startup (exit code %d); last lines of %s:\n%s",
		d.name, st.ExitCode, d.files.logPath, lastLines(out, 20))
	if own := d.containerOutput(); own != "" {
		detail += "\ncontainer output:\n" + lastLines(own, 10)
	}
	if strings.Contains(out, "could not bind") || strings.Contains(out, "Address already in use") {
		return portInUseError(d.files.port, errors.New(detail))
	}
	return errors.New("pgtemp: " + detail)
}

func (d *dockerServer) containerOutput() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var buf bytes.Buffer
	_ = d.client.Logs(dc.LogsOptions{Context: ctx, Container: d.id, OutputStream: &buf, ErrorStream: &buf,
		Stdout: true, Stderr: true, Tail: "20"})
	return strings.TrimSpace(buf.String())
}

// restartImmediate is RestartImmediate in a container: SIGQUIT to the postmaster, PID 1 of the
// container, which is the immediate shutdown of the local provider; the container exits with it
// and is started again: same data directory, same port, WAL recovery at start.
func (d *dockerServer) restartImmediate(ctx context.Context) (time.Duration, error) {
	if d.id == "" {
		return 0, errors.New("pgtemp: RestartImmediate: no container (an earlier start failed)")
	}
	st, err := d.state(ctx)
	if err != nil {
		return 0, fmt.Errorf("pgtemp: RestartImmediate: container %s: %w", d.name, err)
	}
	if !st.Running {
		return 0, fmt.Errorf("pgtemp: RestartImmediate: postgres in container %s had already exited (exit code %d); see %s",
			d.name, st.ExitCode, d.files.logPath)
	}
	d.files.logf("immediate shutdown: SIGQUIT to the postmaster, PID 1 of container %s", d.name)
	t0 := time.Now()
	how, err := d.stopContainer(dc.SIGQUIT, 10*time.Second)
	if err != nil {
		return time.Since(t0), err
	}
	d.files.logf("container %s stopped (%s) %v after SIGQUIT", d.name, how, time.Since(t0).Round(time.Millisecond))
	offset := logSize(d.files.logPath)
	if err := d.client.StartContainerWithContext(d.id, nil, ctx); err != nil {
		return time.Since(t0), fmt.Errorf("pgtemp: RestartImmediate: starting container %s again: %w", d.name, err)
	}
	_, readyAt, err := d.waitReady(ctx, offset)
	if err != nil {
		return time.Since(t0), err
	}
	downtime := readyAt.Sub(t0)
	d.files.logf("container %s started again on port %d after immediate shutdown, recovered from WAL; down for %v",
		d.name, d.files.port, downtime.Round(time.Millisecond))
	return downtime, nil
}

// stopContainer signals PID 1 (the postmaster) with sig and escalates as the local provider
// does: SIGQUIT, then SIGKILL (which kills every process of the container). It returns which
// step ended it.
func (d *dockerServer) stopContainer(sig dc.Signal, grace time.Duration) (string, error) {
	steps := []struct {
		sig   dc.Signal
		grace time.Duration
	}{{sig, grace}, {dc.SIGQUIT, 5 * time.Second}, {dc.SIGKILL, 10 * time.Second}}
	for i, s := range steps {
		if i > 0 && s.sig == steps[i-1].sig {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.grace+5*time.Second)
		err := d.client.KillContainer(dc.KillContainerOptions{ID: d.id, Signal: s.sig, Context: ctx})
		var notRunning *dc.ContainerNotRunning
		if errors.As(err, &notRunning) {
			cancel()
			return "already down", nil
		}
		if err != nil {
			cancel()
			return "", fmt.Errorf("pgtemp: signalling container %s: %w", d.name, err)
		}
		exited := d.waitExit(ctx, s.grace)
		cancel()
		if exited {
			return dockerSignalName(s.sig), nil
		}
	}
	return "", fmt.Errorf("pgtemp: container %s still running after SIGKILL", d.name)
}

func (d *dockerServer) waitExit(ctx context.Context, grace time.Duration) bool {
	deadline := time.Now().Add(grace)
	for {
		st, err := d.state(ctx)
		if err == nil && !st.Running {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dockerSignalName(sig dc.Signal) string {
	switch sig {
	case dc.SIGINT:
		return signalName(syscall.SIGINT)
	case dc.SIGQUIT:
		return signalName(syscall.SIGQUIT)
	}
	return "SIGKILL"
}

// removeContainer removes the container, running or not.
func (d *dockerServer) removeContainer() error {
	if d.id == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := d.client.RemoveContainer(dc.RemoveContainerOptions{ID: d.id, Force: true, RemoveVolumes: true, Context: ctx})
	var gone *dc.NoSuchContainer
	if err != nil && !errors.As(err, &gone) {
		return fmt.Errorf("pgtemp: removing container %s: %w", d.name, err)
	}
	d.id = ""
	return nil
}

// discard undoes a failed start.
func (d *dockerServer) discard() {
	if err := d.removeContainer(); err != nil {
		d.files.logf("%v", err)
	}
	if d.files.tmpDir != "" {
		_ = os.RemoveAll(d.files.tmpDir)
	}
}

// shutdown is Stop: a fast shutdown (SIGINT to the postmaster), then the container and the temp
// directory go.
func (d *dockerServer) shutdown() error {
	t0 := time.Now()
	how := "no container"
	var errs []error
	if d.id != "" {
		var err error
		if how, err = d.stopContainer(dc.SIGINT, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
		if err := d.removeContainer(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(d.files.tmpDir); err != nil {
		errs = append(errs, fmt.Errorf("pgtemp: stop: removing %s: %w", d.files.tmpDir, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.files.logf("stopped (%s), removed container %s and %s in %.1fs", how, d.name, d.files.tmpDir, time.Since(t0).Seconds())
	return nil
}

// sweep removes the containers (and temp directories) that pgtemp started on this machine for
// processes that no longer exist: test binaries killed before their Stop. Best effort.
func (d *dockerServer) sweep(ctx context.Context, logf func(string, ...any)) {
	list, err := d.client.ListContainers(dc.ListContainersOptions{
		All:     true,
		Filters: map[string][]string{"label": {dockerLabelHost + "=" + hostname()}},
		Context: ctx,
	})
	if err != nil {
		logf("listing leftover containers: %v", err)
		return
	}
	for _, c := range list {
		pid, err := strconv.Atoi(c.Labels[dockerLabelPID])
		if err != nil || pid <= 0 || processExists(pid) {
			continue
		}
		err = d.client.RemoveContainer(dc.RemoveContainerOptions{ID: c.ID, Force: true, RemoveVolumes: true, Context: ctx})
		if err != nil {
			logf("removing leftover container %s of dead process %d: %v", c.ID, pid, err)
			continue
		}
		dir := c.Labels[dockerLabelDir]
		if filepath.IsAbs(dir) && strings.HasPrefix(filepath.Base(dir), dockerDirPrefix) {
			_ = os.RemoveAll(dir)
		}
		logf("removed leftover container %s (%v) of dead process %d", c.ID[:min(12, len(c.ID))], c.Names, pid)
	}
}

func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}

func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
