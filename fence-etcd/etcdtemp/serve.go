package etcdtemp

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// bcryptCost is etcd's --bcrypt-cost for every server: bcrypt.MinCost.
const bcryptCost = 4

// serveMarker starts the first line Serve writes. Its absence from a failed child's output tells
// Start that the re-executed binary never called Serve.
const serveMarker = "etcdtemp: serve:"

// serveConfig is what Start passes to the child in ServeEnv, as JSON.
type serveConfig struct {
	Name         string `json:"name"`
	DataDir      string `json:"dataDir"`
	ClientURL    string `json:"clientURL"`
	PeerURL      string `json:"peerURL"`
	ClusterToken string `json:"clusterToken"`
	ClusterState string `json:"clusterState"`
	HeartbeatMs  uint   `json:"heartbeatMs"`
	ElectionMs   uint   `json:"electionMs"`
	// ParentPID lets the child notice that its parent died where the kernel offers no
	// parent-death signal (see procAttr).
	ParentPID int `json:"parentPID"`

	// AdvertisePeerURL, when set, is the peer URL the member announces to its cluster instead of
	// PeerURL, where it listens: a Cluster member announces its proxy (see peerProxy).
	AdvertisePeerURL string `json:"advertisePeerURL,omitempty"`
	// InitialCluster, when set, is etcd's --initial-cluster, every member of a new cluster as
	// name=advertised peer URL; empty means a cluster of this member alone.
	InitialCluster string `json:"initialCluster,omitempty"`

	// TLS, when set, is the client port's TLS (WithClientTLS); ClientURL is then https.
	TLS *serveTLS `json:"tls,omitempty"`
}

// serveTLS is etcd's --cert-file, --key-file, --trusted-ca-file and --client-cert-auth.
type serveTLS struct {
	CertFile       string `json:"certFile"`
	KeyFile        string `json:"keyFile"`
	TrustedCAFile  string `json:"trustedCAFile"`
	ClientCertAuth bool   `json:"clientCertAuth"`
}

// IsServeProcess reports whether this process was started by etcdtemp to run a server, that is,
// whether ServeEnv is set. If it is, the process should call Serve and exit with its result
// instead of doing its usual work.
func IsServeProcess() bool { return os.Getenv(ServeEnv) != "" }

// Serve runs the etcd server described by ServeEnv until the process receives SIGTERM or SIGINT,
// or its parent dies, then shuts it down and returns the exit code: 0 after a requested
// shutdown, 1 if the server failed, 2 if ServeEnv is missing or malformed. Call it from TestMain,
// or from the subcommand named with WithArgs, when IsServeProcess reports true.
//
// It writes nothing to standard output; its progress lines and etcd's own log (errors only) go
// to standard error, which Start directs to etcd.log.
func Serve() int {
	raw := os.Getenv(ServeEnv)
	if raw == "" {
		fmt.Fprintf(os.Stderr, "%s %s is not set: Serve runs only in a process started by etcdtemp.Start\n", serveMarker, ServeEnv)
		return 2
	}
	// Nothing this process starts should believe it is an etcd server too.
	os.Unsetenv(ServeEnv)
	var sc serveConfig
	if err := json.Unmarshal([]byte(raw), &sc); err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", serveMarker, ServeEnv, err)
		return 2
	}
	cfg, err := sc.embedConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", serveMarker, ServeEnv, err)
		return 2
	}

	// Registered before the server starts, so a SIGTERM that arrives during startup is not
	// lost (nor kills the process without a shutdown).
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigc)
	orphaned := watchParent(sc.ParentPID)

	t0 := time.Now()
	fmt.Fprintf(os.Stderr, "%s pid %d starting etcd on %s (peer %s, data dir %s, heartbeat %dms, election %dms)\n",
		serveMarker, os.Getpid(), sc.ClientURL, sc.PeerURL, sc.DataDir, sc.HeartbeatMs, sc.ElectionMs)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdtemp: serve: starting etcd: %v\n", err)
		return 1
	}
	code := serveUntilDone(e, t0, sigc, orphaned, sc.ParentPID)
	e.Close()
	fmt.Fprintf(os.Stderr, "etcdtemp: serve: closed, exit code %d\n", code)
	return code
}

// serveUntilDone waits for the reason to stop and returns the exit code it calls for.
func serveUntilDone(e *embed.Etcd, t0 time.Time, sigc <-chan os.Signal, orphaned <-chan struct{}, parent int) int {
	ready := e.Server.ReadyNotify()
	for {
		select {
		case <-ready:
			ready = nil
			fmt.Fprintf(os.Stderr, "etcdtemp: serve: ready in %.2fs, member %x\n", time.Since(t0).Seconds(), uint64(e.Server.MemberID()))
		case err := <-e.Err():
			fmt.Fprintf(os.Stderr, "etcdtemp: serve: etcd failed: %v\n", err)
			return 1
		case <-e.Server.StopNotify():
			fmt.Fprintf(os.Stderr, "etcdtemp: serve: etcd stopped on its own\n")
			return 1
		case sig := <-sigc:
			fmt.Fprintf(os.Stderr, "etcdtemp: serve: %v: shutting down\n", sig)
			return 0
		case <-orphaned:
			fmt.Fprintf(os.Stderr, "etcdtemp: serve: parent pid %d is gone: shutting down\n", parent)
			return 1
		}
	}
}

// embedConfig turns the child's configuration into etcd's.
func (sc *serveConfig) embedConfig() (*embed.Config, error) {
	cu, err := url.Parse(sc.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("client URL: %w", err)
	}
	pu, err := url.Parse(sc.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("peer URL: %w", err)
	}
	advertise := sc.PeerURL
	if sc.AdvertisePeerURL != "" {
		advertise = sc.AdvertisePeerURL
	}
	au, err := url.Parse(advertise)
	if err != nil {
		return nil, fmt.Errorf("advertised peer URL: %w", err)
	}
	initialCluster := sc.InitialCluster
	if initialCluster == "" {
		initialCluster = sc.Name + "=" + advertise
	}
	cfg := embed.NewConfig()
	cfg.Name = sc.Name
	cfg.Dir = sc.DataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*au}
	cfg.InitialCluster = initialCluster
	cfg.InitialClusterToken = sc.ClusterToken
	cfg.ClusterState = sc.ClusterState
	if t := sc.TLS; t != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       t.CertFile,
			KeyFile:        t.KeyFile,
			TrustedCAFile:  t.TrustedCAFile,
			ClientCertAuth: t.ClientCertAuth,
		}
	}
	// Passwords are hashed with bcrypt's minimum cost (4, where etcd's default is 10): etcd
	// checks the password of every Authenticate, which costs tens of milliseconds at the
	// default and seconds in a race-enabled binary such as a test's. A test server's passwords
	// need no protection against guessing.
	cfg.BcryptCost = bcryptCost
	cfg.TickMs = sc.HeartbeatMs
	cfg.ElectionMs = sc.ElectionMs
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	// "stderr" rather than the default, which would go to journald when run under systemd.
	cfg.LogOutputs = []string{embed.StdErrLogOutput}
	// Durability stays at etcd's defaults, and UnsafeNoFsync in particular stays false: etcd
	// acknowledges a write only once it is in the WAL and fsynced. The crash case F8 depends on
	// this: it checks that no acknowledged token (a revision) is lost or handed out again across
	// KillRestart. A SIGKILL leaves the kernel's page cache intact, so F8 would still pass with
	// fsync off, and that is the danger: the test must vouch for the configuration people run,
	// where the crash may be a power cut, not for one tuned to make tests fast.
	return cfg, nil
}

// watchParent returns a channel that is closed when the parent with the given pid has died, seen
// as this process being handed to another parent. On Linux the parent-death signal kills the
// child first; elsewhere this is the only guard against an orphaned server holding its ports.
func watchParent(pid int) <-chan struct{} {
	c := make(chan struct{})
	if pid <= 0 {
		return c
	}
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for range t.C {
			if os.Getppid() != pid {
				close(c)
				return
			}
		}
	}()
	return c
}
