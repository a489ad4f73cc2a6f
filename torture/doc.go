// Package torture runs randomized fault histories against leasefence's
// backends and checks every history: several holder processes campaign for
// one lease with leasecore.Campaign and, while leading, write user data of
// one scope through the fence, while a seeded nemesis freezes them
// (SIGSTOP, some inside a fenced transaction), kills them (SIGKILL),
// crashes the server, and holds their traffic in a TCP proxy; on a
// 3-member etcd cluster it kills the leader and cuts a member off from the
// others; on three PostgreSQL members under Patroni a crash is one of
// Patroni's failovers (the leader's host killed, its PostgreSQL killed,
// a switchover), the holders finding the new leader through a multi-host
// DSN. The operation log of every history, with one machine clock (CLOCK_MONOTONIC, shared by all processes), and the
// server's final state are then checked: I2 (every token unique, in real
// time order), I3 in real time, the final state, acknowledged writes never
// lost, a linearizability check of the fenced register with porcupine, and
// that no newer holder waited on the fence for an older one.
//
// Negative controls run the same nemesis against designs that must fail —
// an unfenced resource, a fence comparing < instead of <=, a non-durable
// lease and resource on a PostgreSQL cluster with synchronous_commit=off, a
// fence that checks first and holds the floor row's lock until COMMIT,
// the library's fence under Patroni with synchronous_mode off and the
// replicas held back before the leader's host is killed —
// and the run fails if a checker does not catch them.
//
// It is a test-only module: go test runs a short run (make test), and
// `make torture` the long one; docs/torture.md explains both. Linux only:
// holders die with the test binary through Pdeathsig, and the one clock is
// CLOCK_MONOTONIC read by every process.
package torture
