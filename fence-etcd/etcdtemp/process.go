package etcdtemp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errPortInUse marks a start that failed because a port was taken between picking it and etcd
// binding it. Start retries with other ports; KillRestart cannot (the ports are fixed) and
// reports it.
var errPortInUse = errors.New("etcdtemp: port already in use")

// permanentError marks a readiness probe failure that waiting will not cure.
type permanentError struct{ error }

// autoPortAttempts bounds the retries of Start when a kernel-picked port is taken by someone else
// before etcd binds it.
const autoPortAttempts = 3

// child is one run of the server: one re-executed process.
type child struct {
	cmd       *exec.Cmd
	pid       int
	logOffset int64 // where this run's output starts in etcd.log, which restarts append to

	// exit is cancelled once the process has exited and been reaped; waitErr is valid then.
	// A context rather than a bare channel so that readiness probes can be tied to the
	// process's life with context.AfterFunc.
	exit    context.Context
	waitErr error
}

func (p *child) done() <-chan struct{} { return p.exit.Done() }

func (p *child) exited() bool {
	select {
	case <-p.done():
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits until the process is reaped. os.Process knows when it has been
// reaped (it holds a pidfd on Linux), so a late kill never hits a recycled pid.
func (p *child) kill() {
	_ = p.cmd.Process.Kill() // os.ErrProcessDone if it already exited: nothing to do
	<-p.done()
}

// stop asks the server to shut down with SIGTERM and escalates to SIGKILL after grace. It
// returns how the process ended, for the progress log.
func (p *child) stop(grace time.Duration) string {
	if p.exited() {
		return fmt.Sprintf("pid %d had already exited: %v", p.pid, exitText(p.waitErr))
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done():
		return fmt.Sprintf("SIGTERM to pid %d: %s", p.pid, exitText(p.waitErr))
	case <-t.C:
	}
	p.kill()
	return fmt.Sprintf("pid %d ignored SIGTERM for %v: SIGKILL", p.pid, grace)
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// startFirst starts the first child on kernel-picked ports.
func (s *Server) startFirst(ctx context.Context) error {
	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		clientPort, peerPort, err := freePorts(loopback)
		if err != nil {
			return err
		}
		s.clientURL = s.scheme() + "://" + net.JoinHostPort(loopback, strconv.Itoa(clientPort))
		s.peerURL = "http://" + net.JoinHostPort(loopback, strconv.Itoa(peerPort))
		s.serve.ClientURL, s.serve.PeerURL = s.clientURL, s.peerURL
		_, err = s.startAndWait(ctx)
		if err == nil {
			break
		}
		if attempt == autoPortAttempts || !errors.Is(err, errPortInUse) {
			return err
		}
		s.logf("client port %d or peer port %d was taken before etcd could bind it; trying other ports", clientPort, peerPort)
		// etcd fails its bind before it writes anything, but should a WAL exist, it
		// records the old peer URL and the next attempt would restart as that member.
		if err := os.RemoveAll(s.dataDir); err != nil {
			return fmt.Errorf("etcdtemp: %w", err)
		}
	}
	s.logf("started etcd %s on %s in %.2fs (pid %d, data dir %s)",
		s.version, s.clientURL, time.Since(t0).Seconds(), s.PID(), s.dataDir)
	return nil
}

// discard undoes a failed Start: whatever runs dies, the files go.
func (s *Server) discard() {
	if p := s.proc; p != nil {
		s.proc = nil
		s.pid.Store(0)
		p.kill()
	}
	_ = os.RemoveAll(s.tmpDir)
}

// startAndWait starts a child and waits until it serves. It returns the moment the server was
// first seen serving. On failure nothing of this run is left running.
func (s *Server) startAndWait(ctx context.Context) (time.Time, error) {
	p, err := s.spawn()
	if err != nil {
		return time.Time{}, err
	}
	readyAt, err := s.waitReady(ctx, p)
	if err != nil {
		// SIGKILL is safe for the data: acknowledged writes are in the fsynced WAL, and on a
		// first start the directory is about to be removed anyway.
		p.kill()
		return time.Time{}, err
	}
	s.proc = p
	s.pid.Store(int64(p.pid))
	return readyAt, nil
}

func (s *Server) spawn() (*child, error) {
	env, err := s.childEnv()
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: server log: %w", err)
	}
	// The child gets its own copy of the descriptor, so ours is not needed after Start, and no
	// goroutine copies output.
	defer f.Close()
	offset, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: server log: %w", err)
	}

	cmd := exec.Command(s.exe, s.args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("etcdtemp: starting %s: %w", s.exe, err)
	}
	exit, exited := context.WithCancel(context.Background())
	p := &child{cmd: cmd, pid: cmd.Process.Pid, logOffset: offset, exit: exit}
	// The only goroutine etcdtemp leaves running, and only for as long as the child runs: it
	// reaps the child, so no zombie remains and an exit is seen at once.
	go func() {
		p.waitErr = cmd.Wait()
		exited()
	}()
	s.logf("starting etcd child pid %d: %s %s (client %s, peer %s, log %s)",
		p.pid, s.exe, strings.Join(s.args, " "), s.clientURL, s.peerURL, s.logPath)
	return p, nil
}

// childEnv is our environment with the server configuration in ServeEnv.
func (s *Server) childEnv() ([]string, error) {
	b, err := json.Marshal(s.serve)
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: encoding the child's configuration: %w", err)
	}
	gorace := os.Getenv("GORACE")
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, ServeEnv+"=") || strings.HasPrefix(kv, "GORACE=")
	})
	// A binary built with -race sleeps a second before it exits (GORACE atexit_sleep_ms,
	// default 1000), which would add a second to every Stop in a race-enabled test run. The
	// child's races are still reported; only the wait for late reports goes. A value the user
	// set wins; binaries built without -race ignore GORACE.
	if !strings.Contains(gorace, "atexit_sleep_ms") {
		gorace = strings.TrimSpace(gorace + " atexit_sleep_ms=0")
	}
	return append(env, "GORACE="+gorace, ServeEnv+"="+string(b)), nil
}

// waitReady polls until the child serves, exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context, p *child) (time.Time, error) {
	var cli *clientv3.Client
	defer func() {
		if cli != nil {
			cli.Close()
		}
	}()
	// The tick bounds how late readiness is noticed, and so the error of KillRestart's
	// downtime figure.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		readyAt, err := s.probe(ctx, p, &cli)
		if err == nil {
			return readyAt, nil
		}
		if pe, ok := errors.AsType[permanentError](err); ok {
			return time.Time{}, pe.error
		}
		lastErr = err

		// An exit wins over a pending tick or a done context: its output says why.
		select {
		case <-p.done():
			return time.Time{}, s.exitedError(p)
		default:
		}
		select {
		case <-p.done():
			return time.Time{}, s.exitedError(p)
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("etcdtemp: etcd child pid %d on %s not serving (last attempt: %v): %w; last lines of %s:\n%s",
				p.pid, s.clientURL, lastErr, ctx.Err(), s.logPath, lastLines(s.logSince(p.logOffset), 20))
		case <-tick.C:
		}
	}
}

// probe makes one readiness attempt. *cli is created on the first attempt that finds the port
// open and reused by later ones.
func (s *Server) probe(ctx context.Context, p *child, cli **clientv3.Client) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// Once the child has exited there is nothing to wait for, even if something else answers
	// on the port.
	defer context.AfterFunc(p.exit, cancel)()

	// A plain connect fails at once while nothing listens. The gRPC client would instead wait
	// out its reconnect backoff (a second and growing), which would blur the downtime figure.
	u, _ := url.Parse(s.clientURL)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return time.Time{}, err
	}
	conn.Close()

	if *cli == nil {
		c, err := clientv3.New(s.clientConfig())
		if err != nil {
			return time.Time{}, err
		}
		*cli = c
	}
	c := *cli
	// A linearizable read is what "serving" means here: it needs an elected leader and the log
	// applied up to the commit index, which after a kill is the end of the WAL replay. An open
	// port or a Status answer proves neither.
	if _, err := c.Get(ctx, "etcdtemp/ready"); err != nil {
		return time.Time{}, err
	}
	readyAt := time.Now()
	if err := s.checkServer(ctx, c); err != nil {
		return time.Time{}, err
	}
	return readyAt, nil
}

// checkServer makes sure the server that answered is ours. If another server took the client
// port first, ours is about to fail its bind, and the other one (another etcdtemp server, say)
// must not be mistaken for it. After a restart it also checks that the same member came back,
// which proves the data directory was reused.
func (s *Server) checkServer(ctx context.Context, c *clientv3.Client) error {
	ml, err := c.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("listing members: %w", err)
	}
	// A Cluster member has the cluster's size and announces its proxy's URL; a lone server is a
	// cluster of one that announces the URL it listens on.
	size, peer := max(s.clusterSize, 1), s.peerURL
	if s.advertisePeerURL != "" {
		peer = s.advertisePeerURL
	}
	if len(ml.Members) != size || !slices.ContainsFunc(ml.Members, func(m *etcdserverpb.Member) bool {
		return slices.Contains(m.PeerURLs, peer)
	}) {
		var peers []string
		for _, m := range ml.Members {
			peers = append(peers, m.Name+"="+strings.Join(m.PeerURLs, ","))
		}
		return permanentError{fmt.Errorf("%w: another etcd (members %s) answers on %s, not ours (peer %s)",
			errPortInUse, strings.Join(peers, " "), s.clientURL, peer)}
	}
	st, err := c.Status(ctx, s.clientURL)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if s.memberID == 0 {
		// The first start, before Start returns the Server: nothing reads these yet.
		s.memberID = st.Header.MemberId
		s.version = st.Version
		return nil
	}
	if st.Header.MemberId != s.memberID {
		return permanentError{fmt.Errorf("etcdtemp: the restarted server is member %x, the killed one was %x: the data directory %s was not reused",
			st.Header.MemberId, s.memberID, s.dataDir)}
	}
	return nil
}

// exitedError explains why the child exited before serving. A failed bind is marked with
// errPortInUse, the one failure Start can get around by picking other ports.
func (s *Server) exitedError(p *child) error {
	out := s.logSince(p.logOffset)
	detail := fmt.Sprintf("etcd child pid %d exited before serving (%v); last lines of %s:\n%s",
		p.pid, exitText(p.waitErr), s.logPath, lastLines(out, 20))
	if strings.Contains(out, "address already in use") {
		return fmt.Errorf("%w: %s or %s: %s", errPortInUse, s.clientURL, s.peerURL, detail)
	}
	if !strings.Contains(out, serveMarker) {
		return fmt.Errorf("etcdtemp: %s\nThe re-executed binary (%s %s) never ran etcdtemp.Serve: a test binary needs a TestMain "+
			"that calls os.Exit(etcdtemp.Serve()) when etcdtemp.IsServeProcess() reports true, and a program must call it "+
			"in the subcommand it names with WithArgs", detail, s.exe, strings.Join(s.args, " "))
	}
	return fmt.Errorf("etcdtemp: %s", detail)
}

// freePorts picks two distinct free ports on host, a loopback address. Both listeners are open at
// once, so the kernel cannot hand out the same port twice.
func freePorts(host string) (client, peer int, err error) {
	var ports [2]int
	for i := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, 0, fmt.Errorf("etcdtemp: picking a free port: %w", err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports[0], ports[1], nil
}

// logSince returns etcd.log from offset on, at most its last 64 KiB.
func (s *Server) logSince(offset int64) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	const limit = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > limit {
		offset = fi.Size() - limit
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<62))
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return string(b)
}

func lastLines(text string, n int) string {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		return "(log empty)"
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
