//go:build linux

package pgtemp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// The Docker provider's tests need a Docker engine with the image (LocalDockerImage, built by
// scripts/ensure-docker.sh, which `make test` runs; or the image LEASEFENCE_PG_DOCKER names).
// They never pull. Without engine or image they skip, except under CI, where they fail: CI
// installs both, so a skip there would hide a broken setup.

// dockerForTest returns a client of the engine and the image to run, or skips (fails on CI).
func dockerForTest(t *testing.T) (*dc.Client, string) {
	t.Helper()
	image := getenv(envDocker)
	switch image {
	case "", "0":
		image = LocalDockerImage
	case "1":
		image = DefaultDockerImage
	}
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + " (scripts/ensure-docker.sh sets both up; make test runs it)"
		if os.Getenv("CI") != "" {
			t.Fatal("CI: " + msg)
		}
		t.Skip(msg)
	}
	pool, err := dockertest.NewPool("")
	if err != nil {
		unavailable("no Docker client: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := pool.Client.PingWithContext(ctx); err != nil {
		unavailable("no Docker engine at %s: %v", pool.Client.Endpoint(), err)
	}
	if _, err := pool.Client.InspectImage(image); err != nil {
		unavailable("image %s not in the Docker engine: %v", image, err)
	}
	// The other providers' variables must not interfere with what each test selects.
	t.Setenv(envURL, "")
	t.Setenv(envDocker, "")
	return pool.Client, image
}

func TestDockerCluster(t *testing.T) {
	client, image := dockerForTest(t)
	ctx := t.Context()
	t0 := time.Now()
	c := StartTB(t, WithDocker(image), WithLog(testLog{t}), WithSetting("work_mem", "5MB"))
	t.Logf("start took %v; PostgreSQL %s on %s:%d in container %s", time.Since(t0).Round(time.Millisecond),
		c.Version(), c.Host(), c.Port(), c.Container())
	if c.External() || c.Container() == "" || c.Host() != "127.0.0.1" || c.Version() == "" {
		t.Fatalf("External()=%v Container()=%q Host()=%q Version()=%q; want a container on 127.0.0.1 with a version",
			c.External(), c.Container(), c.Host(), c.Version())
	}
	tmp := filepath.Dir(c.DataDir())
	if fi, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil || fi.Size() == 0 {
		t.Fatalf("DataDir %s is not the cluster's data directory on this machine: %v", c.DataDir(), err)
	}

	ctr, err := client.InspectContainer(c.Container())
	if err != nil {
		t.Fatal(err)
	}
	if ctr.HostConfig.NetworkMode != "host" || len(ctr.HostConfig.PortBindings) != 0 || ctr.HostConfig.PublishAllPorts {
		t.Errorf("container network: mode %q, port bindings %v, publish all %v; want the host's network and nothing published",
			ctr.HostConfig.NetworkMode, ctr.HostConfig.PortBindings, ctr.HostConfig.PublishAllPorts)
	}
	if ctr.Config.User == "" || strings.HasPrefix(ctr.Config.User, "0:") {
		t.Errorf("container user %q; want the data directory's unprivileged owner", ctr.Config.User)
	}
	assertListensOnlyOnLoopback(t, c.Port())

	if err := c.CreateDatabase(ctx, "res26"); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, c.DSN("res26"))
	for setting, want := range map[string]string{
		"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
		"listen_addresses": "127.0.0.1", "work_mem": "5MB", "data_directory": c.DataDir(),
	} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
	for _, sql := range []string{
		"CREATE TABLE fence_floor (scope text PRIMARY KEY, token bigint NOT NULL)",
		"INSERT INTO fence_floor VALUES ('report', 7)",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	closeConn(conn)

	port := c.Port()
	downtime, err := c.RestartImmediate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restart downtime %v", downtime)
	if downtime <= 0 || c.Port() != port {
		t.Errorf("downtime %v, port %d -> %d; want > 0 and the same port", downtime, port, c.Port())
	}
	after, err := client.InspectContainer(c.Container())
	if err != nil {
		t.Fatal(err)
	}
	if after.ID != ctr.ID || !after.State.Running || !after.State.StartedAt.After(ctr.State.StartedAt) {
		t.Errorf("after RestartImmediate: container %s running=%v started %v (before: %s started %v); want the same container started again",
			after.ID, after.State.Running, after.State.StartedAt, ctr.ID, ctr.State.StartedAt)
	}
	conn = connect(t, c.DSN("res26"))
	var token int64
	if err := conn.QueryRow(ctx, "SELECT token FROM fence_floor WHERE scope = 'report'").Scan(&token); err != nil || token != 7 {
		t.Fatalf("committed row after the immediate restart: token %d, %v; want 7", token, err)
	}
	if got := show(t, conn, "work_mem"); got != "5MB" {
		t.Errorf("after restart SHOW work_mem = %q, want 5MB (WithSetting applies across restarts)", got)
	}
	closeConn(conn)
	log, err := os.ReadFile(filepath.Join(tmp, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("automatic recovery in progress")) {
		t.Errorf("server log has no \"automatic recovery in progress\": the restart was not a crash\n%s", log)
	}
	assertListensOnlyOnLoopback(t, c.Port())

	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	var gone *dc.NoSuchContainer
	if _, err := client.InspectContainer(ctr.ID); !errors.As(err, &gone) {
		t.Errorf("container %s after Stop: %v; want it removed", c.Container(), err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("%s after Stop: %v; want it removed", tmp, err)
	}
	if _, err := net.DialTimeout("tcp", net.JoinHostPort(loopback, strconv.Itoa(port)), time.Second); err == nil {
		t.Errorf("something still listens on %s:%d after Stop", loopback, port)
	}
}

// assertListensOnlyOnLoopback reads the kernel's socket tables (the container shares this
// network namespace): every listening socket on port must be 127.0.0.1's, none on IPv6.
func assertListensOnlyOnLoopback(t *testing.T, port int) {
	t.Helper()
	hexPort := fmt.Sprintf(":%04X", port)
	found := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" || !strings.HasSuffix(fields[1], hexPort) { // 0A: LISTEN
				continue
			}
			if table != "/proc/net/tcp" || fields[1] != "0100007F"+hexPort {
				t.Errorf("%s: a socket listens on %s (port %d); want 127.0.0.1 only", table, fields[1], port)
			}
			found++
		}
		f.Close()
	}
	if found == 0 {
		t.Errorf("nothing listens on port %d", port)
	}
}

// TestDockerSweepsLeftovers: a container pgtemp made for a process that has died (a test binary
// killed before its Stop) is removed by the next Start.
func TestDockerSweepsLeftovers(t *testing.T) {
	client, image := dockerForTest(t)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	leftover, err := client.CreateContainer(dc.CreateContainerOptions{
		Name: "pgtemp-leftover-test-" + strconv.Itoa(os.Getpid()),
		Config: &dc.Config{
			Image:      image,
			Entrypoint: []string{"/bin/sh", "-c", "exit 0"},
			Labels: map[string]string{
				dockerLabel: "1", dockerLabelPID: strconv.Itoa(dead.Process.Pid), dockerLabelHost: hostname(),
				dockerLabelDir: "/nonexistent/" + dockerDirPrefix + "x",
			},
		},
		HostConfig: &dc.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RemoveContainer(dc.RemoveContainerOptions{ID: leftover.ID, Force: true})
	})
	c := StartTB(t, WithDocker(image), WithLog(testLog{t}))
	var gone *dc.NoSuchContainer
	if _, err := client.InspectContainer(leftover.ID); !errors.As(err, &gone) {
		t.Errorf("leftover container of dead pid %d after Start: %v; want it removed", dead.Process.Pid, err)
	}
	if _, err := client.InspectContainer(c.Container()); err != nil {
		t.Errorf("the new cluster's own container: %v", err)
	}
}

// TestDockerSelection needs no engine: which provider runs, and the errors that say why not.
func TestDockerSelection(t *testing.T) {
	for _, tc := range []struct {
		name          string
		opts          []Option
		envDocker     string
		envURL        string
		wantDocker    bool
		wantImage     string
		wantErrOption bool
	}{
		{name: "nothing set", wantDocker: false},
		{name: "env 0", envDocker: "0", wantDocker: false},
		{name: "env 1", envDocker: "1", wantDocker: true, wantImage: DefaultDockerImage},
		{name: "env image", envDocker: "example/pg:16", wantDocker: true, wantImage: "example/pg:16"},
		{name: "env and URL", envDocker: "1", envURL: "postgres://u@h/db", wantErrOption: true},
		{name: "option default", opts: []Option{WithDocker("")}, wantDocker: true, wantImage: DefaultDockerImage},
		{name: "option wins", opts: []Option{WithDocker(LocalDockerImage)}, envDocker: "x", envURL: "postgres://u@h/db",
			wantDocker: true, wantImage: LocalDockerImage},
		{name: "option with bin dir", opts: []Option{WithDocker(""), WithBinDir("/usr/bin")}, wantErrOption: true},
		{name: "env with bin dir option", opts: []Option{WithBinDir("/usr/bin")}, envDocker: "1", wantErrOption: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envDocker, tc.envDocker)
			t.Setenv(envURL, tc.envURL)
			var cfg config
			for _, o := range tc.opts {
				o(&cfg)
			}
			use, image, err := cfg.dockerChoice()
			if tc.wantErrOption {
				if !errors.Is(err, ErrInvalidOption) {
					t.Fatalf("err = %v, want ErrInvalidOption", err)
				}
				return
			}
			if err != nil || use != tc.wantDocker || image != tc.wantImage {
				t.Errorf("dockerChoice() = %v, %q, %v; want %v, %q", use, image, err, tc.wantDocker, tc.wantImage)
			}
		})
	}
}

func TestDockerNoEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	t.Setenv("DOCKER_CERT_PATH", "")
	t0 := time.Now()
	_, err := Start(t.Context(), WithDocker(LocalDockerImage))
	if !errors.Is(err, ErrNoDocker) {
		t.Fatalf("Start without an engine: %v; want ErrNoDocker", err)
	}
	t.Logf("%v (after %v)", err, time.Since(t0).Round(time.Millisecond))
}

func TestSplitImage(t *testing.T) {
	for ref, want := range map[string][2]string{
		"postgres":                         {"postgres", "latest"},
		"postgres:17":                      {"postgres", "17"},
		"localhost:5000/pg":                {"localhost:5000/pg", "latest"},
		"localhost:5000/pg:16":             {"localhost:5000/pg", "16"},
		"postgres@sha256:0123":             {"postgres", "sha256:0123"},
		"docker.io/library/postgres:17.2":  {"docker.io/library/postgres", "17.2"},
		"leasefence/pgtemp:local":          {"leasefence/pgtemp", "local"},
		"registry.example/a/b/postgres:15": {"registry.example/a/b/postgres", "15"},
	} {
		if repo, tag := splitImage(ref); repo != want[0] || tag != want[1] {
			t.Errorf("splitImage(%q) = %q, %q; want %q, %q", ref, repo, tag, want[0], want[1])
		}
	}
}
