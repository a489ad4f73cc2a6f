package torture

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// patroniWait bounds each of the nemesis's waits on a Patroni cluster: for
// the next leader (Patroni's leader key lives 10 s after the last renewal,
// then a replica's loop takes the lead) and for a restarted member to
// rejoin (pg_rewind, or a fresh copy). Only a cluster that is badly broken
// takes that long; the run then fails.
const patroniWait = 3 * time.Minute

// patroniHold is how long the unsafe control's leader acknowledges commits
// its replicas never receive before its host is killed: the holders
// acquire and write meanwhile.
const patroniHold = 1500 * time.Millisecond

// patroniServer is PostgreSQL as users deploy it for failover: three
// members managed by Patroni (pgtemp.StartPatroni: Debian's Patroni, an
// etcd of its own as its store, member i on 127.0.0.(i+1)). Each holder
// gets one proxy per member and a multi-host DSN through them with
// target_session_attrs=read-write, so its pools find whichever member
// Patroni promoted, as an application that lists the cluster's hosts
// does. A crash is one of Patroni's failovers, in turn: the leader's host
// killed (Patroni and PostgreSQL, SIGKILL; restarted afterwards, it
// rejoins through pg_rewind), the leader's PostgreSQL killed with its
// Patroni left running, and a planned switchover; each returns once all
// three members stream again.
//
// unsafe is the negative control: synchronous_mode off, and before each
// kill of the leader's host its WAL senders are stopped for patroniHold,
// so that the replicas lack the commits of that time and Patroni promotes
// one of them anyway (the lag stays under maximum_lag_on_failover).
type patroniServer struct {
	pc     *pgtemp.PatroniCluster
	reads  *pgxpool.Pool // the parent's reads, straight to the leader
	unsafe bool

	mu      sync.Mutex
	crashes int
}

var _ server = (*patroniServer)(nil)

func startPatroni(ctx context.Context, unsafe bool) (*patroniServer, error) {
	pc, err := pgtemp.StartPatroni(ctx, !unsafe)
	if err != nil {
		return nil, err
	}
	s := &patroniServer{pc: pc, unsafe: unsafe}
	if err := migratePG(ctx, pc.CreateDatabase, pc.DSN); err != nil {
		_ = pc.Stop()
		return nil, err
	}
	if s.reads, err = pgxpool.New(ctx, pc.DSN(pgResDB)+"&pool_max_conns=8"); err != nil {
		_ = pc.Stop()
		return nil, err
	}
	return s, nil
}

func (s *patroniServer) name() string {
	if s.unsafe {
		return "pg under Patroni, synchronous_mode off"
	}
	return "pg under Patroni"
}

func (s *patroniServer) backend() string { return "pg" }

func (s *patroniServer) describe() string {
	var ms []string
	for _, m := range s.pc.Members() {
		ms = append(ms, m.String())
	}
	mode := "synchronous_mode on (not strict): Patroni promotes only its synchronous standby"
	if s.unsafe {
		mode = "synchronous_mode off, maximum_lag_on_failover 1 MiB (Patroni's default)"
	}
	return fmt.Sprintf("%s, members %s, etcd as its store, ttl 10 s, loop_wait 1 s; %s; holders reach the leader through a multi-host DSN (target_session_attrs=read-write), one proxy per member",
		s.pc.Version(), strings.Join(ms, ", "), mode)
}

func (s *patroniServer) targets() []string {
	var ts []string
	for _, m := range s.pc.Members() {
		ts = append(ts, m.Host+":"+strconv.Itoa(m.Port))
	}
	return ts
}

func (s *patroniServer) holderSpec(proxyAddrs []string) holderSpec {
	hosts := strings.Join(proxyAddrs, ",")
	return holderSpec{Backend: "pg",
		LeaseDSN:    viaProxy(s.pc.DSN(pgLeaseDB), hosts, 3),
		ResourceDSN: viaProxy(s.pc.DSN(pgResDB), hosts, 4)}
}

func (s *patroniServer) read(ctx context.Context, scope string, fl flavor) (Snapshot, error) {
	return readPG(ctx, s.reads, scope, fl)
}

// crash runs the next of Patroni's failovers (see patroniServer); downtime
// runs from the fault to the first write the next leader accepted.
func (s *patroniServer) crash(ctx context.Context) (time.Duration, string, error) {
	s.mu.Lock()
	n := s.crashes
	s.crashes++
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, patroniWait)
	defer cancel()
	old, err := s.pc.Leader(ctx)
	if err != nil {
		return 0, "", err
	}
	var down time.Duration
	var how string
	switch {
	case s.unsafe:
		down, how, err = s.killHeldLeader(ctx, old)
	case n%3 == 0:
		down, how, err = s.killLeaderHost(ctx, old)
	case n%3 == 1:
		down, how, err = s.killLeaderPostgres(ctx, old)
	default:
		down, how, err = s.switchover(ctx)
	}
	if err != nil {
		return down, how, err
	}
	t1 := time.Now()
	if err := s.pc.WaitHealthy(ctx); err != nil {
		return down, how, err
	}
	return down, fmt.Sprintf("%s; all three members streaming again %v later", how, time.Since(t1).Round(time.Millisecond)), nil
}

// killLeaderHost kills the leader's host, waits for Patroni's next leader
// and restarts the killed member, which rejoins as a replica.
func (s *patroniServer) killLeaderHost(ctx context.Context, old pgtemp.PatroniMember) (time.Duration, string, error) {
	t0 := time.Now()
	if err := s.pc.KillMember(old); err != nil {
		return 0, "", err
	}
	next, err := s.pc.WaitLeader(ctx, old)
	if err != nil {
		return 0, "", err
	}
	down := time.Since(t0)
	if err := s.pc.RestartMember(old); err != nil {
		return down, "", err
	}
	return down, fmt.Sprintf("SIGKILL to the leader's host %s (Patroni and PostgreSQL); Patroni promoted %s, writable after %v; %s restarted",
		old.Name, next.Name, down.Round(time.Millisecond), old.Name), nil
}

// killLeaderPostgres kills the leader's PostgreSQL and leaves its Patroni
// running, which starts it again; whoever leads then is Patroni's choice.
func (s *patroniServer) killLeaderPostgres(ctx context.Context, old pgtemp.PatroniMember) (time.Duration, string, error) {
	t0 := time.Now()
	if err := s.pc.KillPostgres(old); err != nil {
		return 0, "", err
	}
	next, err := s.pc.WaitLeader(ctx, pgtemp.PatroniMember{})
	if err != nil {
		return 0, "", err
	}
	down := time.Since(t0)
	return down, fmt.Sprintf("SIGKILL to the leader's PostgreSQL on %s, its Patroni left running; %s leads, writable after %v",
		old.Name, next.Name, down.Round(time.Millisecond)), nil
}

// switchover is a planned switchover, Patroni choosing the next leader.
func (s *patroniServer) switchover(ctx context.Context) (time.Duration, string, error) {
	t0 := time.Now()
	from, to, err := s.pc.Switchover(ctx)
	if err != nil {
		return 0, "", err
	}
	down := time.Since(t0)
	return down, fmt.Sprintf("planned switchover (Patroni's POST /switchover) from %s to %s, writable after %v",
		from.Name, to.Name, down.Round(time.Millisecond)), nil
}

// killHeldLeader is the unsafe control's crash: the leader's WAL senders
// stopped (once the replicas have everything so far), patroniHold of
// commits the replicas never receive, then the leader's host killed.
func (s *patroniServer) killHeldLeader(ctx context.Context, old pgtemp.PatroniMember) (time.Duration, string, error) {
	heldAt, err := s.pc.HoldBackReplicas(ctx)
	if err != nil {
		return 0, "", err
	}
	sleepCtx(ctx, patroniHold)
	lag, err := walSince(ctx, old, heldAt)
	if err != nil {
		return 0, "", err
	}
	down, how, err := s.killLeaderHost(ctx, old)
	return down, fmt.Sprintf("WAL senders of %s stopped at %s for %v (%d bytes of WAL its replicas never received; maximum_lag_on_failover 1048576); %s",
		old.Name, heldAt, patroniHold, lag, how), err
}

// walSince is how many bytes of WAL m wrote after lsn.
func walSince(ctx context.Context, m pgtemp.PatroniMember, lsn string) (int64, error) {
	conn, err := pgx.Connect(ctx, m.DSN("postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	err = conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", lsn).Scan(&n)
	return n, err
}

func (s *patroniServer) close() error {
	if s.reads != nil {
		s.reads.Close()
	}
	return s.pc.Stop()
}
