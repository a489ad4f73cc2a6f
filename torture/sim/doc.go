// Package sim is a deterministic simulation of leasefence beyond one
// machine: many holders, scopes partitioned across several resource
// servers, lease servers, pauses, failovers and scope moves, with the I2
// and I3 checkers over more than a million operations. It shows that no
// cross-server coordination is needed when each scope's floor lives with
// its data, and it fails on seeded bugs (a move that forgets the floor, a
// move that forgets to seal the old location, asynchronous standbys).
//
// # The model
//
// Discrete events on a virtual clock, one PCG generator seeded from the
// configuration, one goroutine: the same seed gives the same history, bit
// for bit (TestSimDeterministic compares the log's hash).
//
//   - Lease servers (2): lease name s (the lease of scope s) lives on
//     server s mod 2. An acquire of a free or expired name issues the next
//     token of that name; renew and release need the current holder and
//     token. Expiry is by the server's clock: a holder that does not renew
//     loses the lease TTL (200 ms) after its last acquire or renewal.
//   - Resource servers (8): the 256 scopes, partitioned by a routing
//     table. A server keeps, per scope, the data, the floor, and whether it
//     holds the scope, has never held it, or sealed it ("moved to j"). Its
//     write path, scopeRec.write, is one atomic step on the server's own
//     record of the scope and nothing else: moved marker, floor check,
//     write. It is a method of that record and is passed nothing else, so
//     by construction no write reads another server, the lease service or
//     the routing table.
//   - Every server is a primary with a synchronous standby: a change is
//     applied at the primary (visible at once to the requests after it),
//     shipped to the standby in order, and acknowledged to the
//     client only once the standby has it. A failover crashes the primary
//     at a random moment (exponential, every 250 ms on average over all ten
//     servers): what it had not shipped is lost, requests in flight get no
//     answer (an unknown outcome after the client's 50 ms timeout; the
//     change may or may not have reached the standby), and after 5–30 ms
//     the standby is promoted. What was acknowledged is on the standby, so
//     it is never lost.
//   - Holders (64): pick a scope, acquire its lease (reading the routing
//     table half of the time, else trusting their cache), then do 3–40
//     writes with their token, each after 0.2–2 ms of work and a check of
//     the local deadline, renewing every TTL/3, then release. A holder's
//     clock runs at 1 ± 1 % of the servers' (drift bound 10,000 ppm); its
//     local deadline is its clock read before the acquire or renew was
//     sent, plus TTL, minus a margin of 20 ms (more than the 2 ms the drift
//     can eat in a TTL). One write in a hundred is preceded by a pause
//     after the check: the stale holder of the lease-fencing article
//     (SOURCES.md), which sends the write it had decided on when it wakes;
//     60 % of the pauses last 0.5–3 TTL and outlive the lease. A refused
//     write (below the floor) ends the holding. An answer "moved to j" is
//     followed at once by the client's routing layer, without another look
//     at the lease.
//   - Moves (one at a time, every 5 ms on average): the mover seals the
//     scope at its location i — a committed change after which i answers
//     every write for it "moved to j" and whose answer carries the data and
//     the floor, final from that moment — copies them (1–5 ms), installs
//     them at j — a committed change with which j starts accepting, with
//     that floor — and only then points the routing table at j. Holders
//     that reach j in between are told "not here" and ask the table again.
//     The move is the only coordination there is, and the write path takes
//     no part in it.
//   - The auditor reads a random scope every millisecond, and every scope
//     of a resource server right after its failover, so that an
//     acknowledged write a failover lost shows before it is written over.
//
// # The checkers
//
// check reads only the operation log and the final state of each scope
// (read at its location after the run): I2 per lease name (token reuse,
// real-time order), I3 per scope across servers and moves, acknowledged
// writes never lost (every read and the final state), and the final state
// (floor = the largest accepted token, data = the last write of that
// token). The checkers' names are the torture run's.
//
// # Not modelled
//
// Network partitions and messages lost or held back outside failovers (no
// request reaches a server after its client gave up); servers' clocks
// (exact, and a promoted standby's equals the old primary's); the time a
// new standby takes to catch up (it joins at once), so no double failure
// loses a server's state; a mover that crashes (it is reliable, its two
// steps idempotent and retried) or two moves at once; the routing table's
// own replication (it is one consistent table; only holders' caches go
// stale); writes spanning several scopes; pauses anywhere but between a
// holder's check and its write. Renewals and releases are logged and
// counted, not checked. The figures are virtual: they say nothing about
// real throughput.
//
// # Speed
//
// The simulation runs on one goroutine, so the race detector has nothing
// to find in it; its per-event functions and the checkers carry
// //go:norace, without which a million-operation run takes ~15 times as
// long under `go test -race` (scripts/test.sh). The tests themselves are
// instrumented.
package sim
