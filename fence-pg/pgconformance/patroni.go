package pgconformance

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// patroniFailoverTimeout bounds Failover's wait for Patroni to name a new
// leader that accepts writes: its leader key lives 10 s after the last
// renewal, then a replica's loop (every second) takes the lead; a busy
// machine stretches both.
const patroniFailoverTimeout = 60 * time.Second

// startPatroni is StartReplicas with Config.Patroni: a pgtemp.PatroniCluster
// of Config.Cluster's binaries, the lease and resource databases created
// on its leader, and the TCP proxy on 127.0.0.1 in front of the leader
// that every client connects through and that Failover moves to the member
// Patroni promotes — what HAProxy does with Patroni's REST health check.
func (h *harness) startPatroni(ctx context.Context, mode conformance.ReplicationMode) (conformance.ReplicaSet, error) {
	t0 := time.Now()
	pc, err := pgtemp.StartPatroni(ctx, mode == conformance.ReplicationSynchronous, pgtemp.WithBinDir(h.cfg.Cluster.BinDir()))
	if err != nil {
		return nil, fmt.Errorf("%s: StartReplicas: %w", pkg, err)
	}
	if !h.onClose(pc.Stop) {
		_ = pc.Stop()
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	// The leader the cluster started with; Failover moves the proxy on.
	leader, err := pc.Leader(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: StartReplicas: %w", pkg, err)
	}
	ps := &patroniSet{replicaBase: replicaBase{mode: mode}, pc: pc}
	if err := h.openReplicaBase(ctx, &ps.replicaBase, t0, pc.CreateDatabase,
		net.JoinHostPort(leader.Host, strconv.Itoa(leader.Port)), leader.DSN); err != nil {
		return nil, err
	}
	if ps.settings, err = patroniSettings(ctx, leader); err != nil {
		return nil, fmt.Errorf("%s: StartReplicas: reading the leader's settings: %w", pkg, err)
	}
	return ps, nil
}

// patroniSettings asks the leader for the settings that make the mode, so
// that Describe states what the servers run with, not what was asked for.
func patroniSettings(ctx context.Context, leader pgtemp.PatroniMember) (string, error) {
	conn, err := pgx.Connect(ctx, leader.DSN("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version, commit, names, fsync string
	var sync []string
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'),
		current_setting('synchronous_standby_names'), current_setting('fsync'),
		coalesce(array_agg(application_name || '=' || sync_state ORDER BY application_name) FILTER (WHERE application_name IS NOT NULL), '{}')
		FROM (SELECT 1) one LEFT JOIN pg_stat_replication ON true`).Scan(&version, &commit, &names, &fsync, &sync)
	if err != nil {
		return "", err
	}
	streaming := "pg_stat_replication " + strings.Join(sync, ", ")
	if len(sync) == 0 {
		// Patroni restarts a new replica's replication once after it joins.
		streaming = "no replica connected at this moment"
	}
	return fmt.Sprintf("PostgreSQL %s; leader %s: synchronous_commit=%s, synchronous_standby_names='%s', fsync=%s, %s",
		version, leader.Name, commit, names, fsync, streaming), nil
}

// patroniSet is a conformance.ReplicaSet on a pgtemp.PatroniCluster.
type patroniSet struct {
	replicaBase
	pc *pgtemp.PatroniCluster
}

var _ conformance.ReplicaSet = (*patroniSet)(nil)

// Describe implements conformance.ReplicaSet.
func (ps *patroniSet) Describe() string {
	var members []string
	for _, m := range ps.pc.Members() {
		members = append(members, m.String())
	}
	mode := "synchronous_mode=off, maximum_lag_on_failover=1048576"
	if ps.pc.Synchronous() {
		mode = "synchronous_mode=on (not strict)"
	}
	d := fmt.Sprintf("%s replication: %s cluster of %s, etcd as its store, ttl=10 loop_wait=1 retry_timeout=4, %s, started in %v; %s; "+
		"clients connect through a TCP proxy on %s that a failover moves to the member Patroni promotes",
		ps.mode, ps.pc.Version(), strings.Join(members, ", "), mode, ps.started.Round(time.Millisecond), ps.settings, ps.proxy.addr())
	if ps.pooler != "" {
		d += "; the cluster is reached directly, not through " + ps.pooler
	}
	return d
}

// HoldBackStandby implements conformance.ReplicaSet with
// pgtemp.PatroniCluster.HoldBackReplicas: it waits until both replicas have
// replayed the leader's current WAL position, then stops the leader's WAL
// senders with SIGSTOP. Synchronous mode: an error wrapping
// errors.ErrUnsupported.
func (ps *patroniSet) HoldBackStandby(ctx context.Context) error {
	return ps.holdBack(ctx, ps.pc.HoldBackReplicas)
}

// Failover implements conformance.ReplicaSet: the leader's host crashes
// (pgtemp.PatroniCluster.KillMember: SIGKILL to its Patroni and its
// PostgreSQL), Patroni promotes a replica once the leader key expires, and
// the proxy moves to it, dropping the connections it carried. downtime
// runs from the SIGKILL to the first commit of a transaction with a
// transaction id through the moved proxy.
func (ps *patroniSet) Failover(ctx context.Context) (string, time.Duration, error) {
	if err := ps.beginFailover(); err != nil {
		return "", 0, err
	}
	defer ps.mu.Unlock()
	old, err := ps.pc.Leader(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
	}
	t0 := time.Now()
	if err := ps.pc.KillMember(old); err != nil {
		return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
	}
	wctx, cancel := context.WithTimeout(ctx, patroniFailoverTimeout)
	next, err := ps.pc.WaitLeader(wctx, old)
	cancel()
	if err != nil {
		return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
	}
	promoted := time.Since(t0)
	dropped := ps.proxy.moveTo(net.JoinHostPort(next.Host, strconv.Itoa(next.Port)))
	if err := firstWrite(ctx, next.DSN(replicaLeaseDB), ps.proxy.addr()); err != nil {
		return "", 0, fmt.Errorf("%s: Failover: no write through the proxy moved to %s: %w", pkg, next, err)
	}
	downtime := time.Since(t0)
	held := ""
	if ps.heldAt != "" {
		held = fmt.Sprintf(" (its WAL senders stopped since LSN %s: the replicas received nothing after it)", ps.heldAt)
	}
	how := fmt.Sprintf("SIGKILL to the leader's host %s, Patroni and PostgreSQL%s; Patroni promoted %s, writable %v after the kill; "+
		"proxy %s moved to it (%d connections still open through it dropped); downtime measured from the SIGKILL to the first commit through the moved proxy",
		old, held, next, promoted.Round(time.Millisecond), ps.proxy.addr(), dropped)
	return how, downtime, nil
}
