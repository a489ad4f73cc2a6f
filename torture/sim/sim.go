package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// bug selects the design a run simulates: the correct one, or one with a
// seeded bug that the checkers must catch in every run.
type bug uint8

const (
	bugNone             bug = iota
	bugMoveForgetsFloor     // the move copies the data but not the floor: the new location starts at floor 0
	bugMoveForgetsSeal      // the move copies data and floor but leaves the old location accepting the scope
	bugAsyncStandby         // every standby is asynchronous: a primary acknowledges before its standby has the change
)

func (b bug) String() string {
	switch b {
	case bugNone:
		return "fence"
	case bugMoveForgetsFloor:
		return "move forgets the floor"
	case bugMoveForgetsSeal:
		return "move forgets to seal the old location"
	case bugAsyncStandby:
		return "asynchronous standbys"
	}
	return fmt.Sprintf("bug(%d)", b)
}

// config is a run's whole input: a run is a function of it.
type config struct {
	seed uint64
	ops  int // holder requests (acquire, renew, write) issued before everyone stops
	bug  bug

	holders, scopes, servers, leaseServers int

	ttl, renewEvery, margin time.Duration
	driftPPM                int64 // a holder's clock runs at 1 ± driftPPM/1e6 of the virtual (servers') clock

	netMin, netMax           time.Duration // one way, client to server and back
	repMin, repMax           time.Duration // one way, primary to standby and back
	asyncLagMin, asyncLagMax time.Duration // bugAsyncStandby: how far behind the standby applies a change
	timeout                  time.Duration // a client gives up on an unanswered request after this long

	workMin, workMax     time.Duration // a holder's work before each write
	writesMin, writesMax int           // writes per holding, then the holder releases
	backoffMax           time.Duration // after held, lost or rejected
	refreshProb          float64       // chance a holder reads the routing table when it acquires (else its cache)

	pauseProb        float64       // per write: the holder freezes between its check and its write
	longShare        float64       // the share of pauses that outlive the lease
	shortMax         time.Duration // a short pause: up to this
	longMin, longMax time.Duration // a long pause

	failoverEvery          time.Duration // mean time between failovers (exponential)
	promoteMin, promoteMax time.Duration // from the crash of the primary to the standby answering
	moveEvery              time.Duration // mean time between the end of a move and the start of the next
	copyMin, copyMax       time.Duration // from the seal at the old location to the install at the new one
	readEvery              time.Duration // mean time between the auditor's reads
}

// defaultConfig is the simulated system of the tests: 64 holders, 256
// scopes on 8 resource servers, 256 lease names on 2 lease servers, each
// server a primary with a synchronous standby.
func defaultConfig(seed uint64) config {
	const ttl = 200 * time.Millisecond
	return config{
		seed: seed, ops: 1_000_000,
		holders: 64, scopes: 256, servers: 8, leaseServers: 2,
		ttl: ttl, renewEvery: ttl / 3, margin: 20 * time.Millisecond, driftPPM: 10_000,
		netMin: 50 * time.Microsecond, netMax: 500 * time.Microsecond,
		repMin: 50 * time.Microsecond, repMax: 300 * time.Microsecond,
		asyncLagMin: 2 * time.Millisecond, asyncLagMax: 20 * time.Millisecond,
		timeout: 50 * time.Millisecond,
		workMin: 200 * time.Microsecond, workMax: 2 * time.Millisecond,
		writesMin: 3, writesMax: 40,
		backoffMax:  5 * time.Millisecond,
		refreshProb: 0.5,
		pauseProb:   0.01, longShare: 0.6,
		shortMax: 20 * time.Millisecond, longMin: ttl / 2, longMax: 3 * ttl,
		failoverEvery: 250 * time.Millisecond,
		promoteMin:    5 * time.Millisecond, promoteMax: 30 * time.Millisecond,
		moveEvery: 5 * time.Millisecond,
		copyMin:   1 * time.Millisecond, copyMax: 5 * time.Millisecond,
		readEvery: 1 * time.Millisecond,
	}
}

// ---- Servers ----

// scopeRec is one resource server's record of one scope: the data, the
// floor, and whether the server holds the scope at all.
type scopeRec struct {
	floor   uint64 // the largest token this server accepted for the scope (or was handed by a move)
	token   uint64 // the data: the token and content of the write it holds
	content uint64
	movedTo int32 // sealed: where the scope went
	state   recState
}

type recState uint8

const (
	recAbsent recState = iota // the scope was never here
	recOwned                  // the server holds the scope and accepts writes for it
	recSealed                 // the scope moved away: every write is answered "moved to movedTo"
)

// write is the whole write path of a resource server: the moved marker,
// the floor check and the write, in one atomic step, on the server's own
// record of the scope. It is a method of the record and gets nothing else:
// by construction no write consults another server, the lease service or
// the routing table.
//
//go:norace
func (r *scopeRec) write(token, content uint64) (outcome, uint64) {
	switch {
	case r.state == recSealed:
		return oMoved, uint64(r.movedTo)
	case r.state != recOwned:
		return oNotHere, 0
	case token < r.floor:
		return oRejected, r.floor
	}
	r.floor, r.token, r.content = token, token, content
	return oAccepted, token
}

// leaseRec is one lease name at its lease server.
type leaseRec struct {
	counter uint64 // the last token issued for the name
	holder  int32  // -1: nobody
	token   uint64 // the holder's token
	expiry  time.Duration
}

// node is a server: a primary and a standby, each with a record per index
// (scope or lease name). A change is applied at the primary and shipped to
// the standby in order; with a synchronous standby the client's answer
// leaves only when the standby's acknowledgement is back, so whatever was
// acknowledged survives a failover. The primary's own changes are visible
// to the requests after them at once, before the standby has them: such a
// change is not acknowledged yet, a failover may lose it, and a later
// request may already have been judged by it (a rejection against a floor
// that is then lost). PostgreSQL makes that later write wait for the
// earlier commit's acknowledgement instead; the model is the harsher one.
type node[R any] struct {
	up          bool
	epoch       int32 // one per primary: events of a crashed primary are dropped
	primary     []R
	standby     []R
	queue       []entry[R]    // applied at the primary, on their way to the standby, oldest first
	lastDeliver time.Duration // the changes reach the standby in order
}

type entry[R any] struct {
	idx   int32
	rec   R
	reply msg
	wait  bool // synchronous: the reply waits for the standby
}

// commit applies a change at the primary and ships it to the standby; the
// reply goes when the standby has it (or at once, with bugAsyncStandby).
//
//go:norace
func commit[R any](s *sim, n *node[R], id, idx int32, rec R, reply msg) {
	n.primary[idx] = rec
	async := s.cfg.bug == bugAsyncStandby
	d := s.between(s.cfg.repMin, s.cfg.repMax)
	if async {
		d = s.between(s.cfg.asyncLagMin, s.cfg.asyncLagMax)
	}
	at := max(s.now+d, n.lastDeliver)
	n.lastDeliver = at
	n.queue = append(n.queue, entry[R]{idx, rec, reply, !async})
	s.push(event{at: at, kind: evStandby, node: id, epoch: n.epoch})
	if async {
		s.reply(reply)
	}
}

// deliver applies the oldest shipped change at the standby.
//
//go:norace
func deliver[R any](s *sim, n *node[R], e event) {
	if e.epoch != n.epoch {
		return // shipped by a primary that crashed first: the standby never got it
	}
	en := n.queue[0]
	n.queue = n.queue[1:]
	n.standby[en.idx] = en.rec
	if en.wait {
		s.push(event{at: s.now + s.between(s.cfg.repMin, s.cfg.repMax), kind: evAck, node: e.node, epoch: n.epoch, m: en.reply})
	}
}

// acked lets a reply go once the standby's acknowledgement reached the
// primary; a primary that crashed in between never answers (the change is
// durable all the same: an unknown outcome that took effect).
//
//go:norace
func acked[R any](s *sim, n *node[R], e event) {
	if e.epoch != n.epoch {
		s.drop(e.m)
		return
	}
	s.reply(e.m)
}

// crash kills the primary at the current moment: what it had not shipped
// to the standby is lost, and the requests waiting on it get no answer.
func crash[R any](s *sim, n *node[R]) {
	n.up = false
	n.epoch++
	for _, en := range n.queue {
		if en.wait {
			s.drop(en.reply)
		}
	}
	n.queue = n.queue[:0]
}

// promote makes the standby the primary. A new synchronous standby is
// assumed to join at once as a copy of it (the time a real resync takes is
// not modelled).
func promote[R any](s *sim, n *node[R]) {
	copy(n.primary, n.standby)
	n.up = true
	n.lastDeliver = s.now
}

// ---- Events ----

type evKind uint8

const (
	evHolder  evKind = iota // a holder's next step (event.step)
	evArrive                // a request reaches a server
	evStandby               // the oldest shipped change reaches a standby
	evAck                   // a standby's acknowledgement reaches its primary
	evReply                 // an answer reaches its client
	evTimeout               // a client gives up on a request that will never be answered
	evCrash                 // the nemesis fails a server over
	evPromote               // a failed server's standby takes over
	evMove                  // the mover starts the next move
	evInstall               // the mover, done copying, installs the scope at its new location
	evRead                  // the auditor reads a random scope
)

type event struct {
	at    time.Duration
	kind  evKind
	step  step
	node  int32
	epoch int32
	m     msg
}

// msg is a request and, on its way back, its answer.
type msg struct {
	sent                  time.Duration // the client's timeout counts from here
	token, floor, content uint64
	op                    int32 // the log entry of the operation
	client                int32 // a holder, or cAuditor, cMover
	scope                 int32
	to                    int32 // moved: where to; seal: the new location
	kind                  opKind
	out                   outcome
	hops                  uint8 // redirects followed so far
}

const (
	cAuditor int32 = -1
	cMover   int32 = -2
)

// The queue is a binary heap of small entries (time, sequence, slot); the
// events themselves stay put in a slab. Moving 16 bytes per swap instead of
// a whole event keeps a million-operation run fast under the race
// detector, which instruments every word moved.
type qent struct {
	at   time.Duration
	seq  uint32 // ties in time go in scheduling order: the run is deterministic
	slot int32
}

func less(a, b qent) bool { return a.at < b.at || (a.at == b.at && a.seq < b.seq) }

//go:norace
func (s *sim) push(e event) {
	var slot int32
	if n := len(s.free); n > 0 {
		slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.slab[slot] = e
	} else {
		slot = int32(len(s.slab))
		s.slab = append(s.slab, e)
	}
	q := qent{at: e.at, seq: s.seq, slot: slot}
	s.seq++
	s.q = append(s.q, q)
	i := len(s.q) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(q, s.q[p]) {
			break
		}
		s.q[i] = s.q[p]
		i = p
	}
	s.q[i] = q
}

//go:norace
func (s *sim) pop() event {
	top := s.q[0]
	n := len(s.q) - 1
	last := s.q[n]
	s.q = s.q[:n]
	if n > 0 {
		i := 0
		for {
			c := 2*i + 1
			if c >= n {
				break
			}
			if r := c + 1; r < n && less(s.q[r], s.q[c]) {
				c = r
			}
			if !less(s.q[c], last) {
				break
			}
			s.q[i] = s.q[c]
			i = c
		}
		s.q[i] = last
	}
	s.free = append(s.free, top.slot)
	return s.slab[top.slot]
}

// ---- The simulation ----

type sim struct {
	cfg       config
	rng       *rand.Rand
	now       time.Duration
	seq       uint32
	q         []qent
	slab      []event
	free      []int32
	log       []op
	res       []node[scopeRec] // resource servers: node ids 0..servers-1
	lease     []node[leaseRec] // lease servers: node ids servers..servers+leaseServers-1
	directory []int32          // the routing table: scope -> resource server; only the mover changes it
	holders   []holder
	mv        mover
	content   uint64 // the last content handed out: every write's is unique
	issued    int    // holder requests sent, releases left out
	stopping  bool   // the budget is spent: nobody starts anything new
	events    int
}

// result is a finished run.
type result struct {
	log    []op
	final  []scopeState
	events int
}

// run simulates one history: a function of cfg (its seed included).
func run(cfg config) result {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.seed, 0x6c65617365666e63))}
	s.log = make([]op, 0, cfg.ops+cfg.ops/4)
	s.res = make([]node[scopeRec], cfg.servers)
	for k := range s.res {
		s.res[k] = node[scopeRec]{up: true, primary: make([]scopeRec, cfg.scopes), standby: make([]scopeRec, cfg.scopes)}
	}
	s.lease = make([]node[leaseRec], cfg.leaseServers)
	for l := range s.lease {
		n := node[leaseRec]{up: true, primary: make([]leaseRec, cfg.scopes), standby: make([]leaseRec, cfg.scopes)}
		for i := range n.primary {
			n.primary[i].holder, n.standby[i].holder = -1, -1
		}
		s.lease[l] = n
	}
	s.directory = make([]int32, cfg.scopes)
	for sc := range s.directory {
		k := int32(sc % cfg.servers)
		s.directory[sc] = k
		s.res[k].primary[sc].state = recOwned
		s.res[k].standby[sc].state = recOwned
	}
	s.holders = make([]holder, cfg.holders)
	for i := range s.holders {
		s.holders[i] = holder{
			id:     int32(i),
			ppm:    s.rng.Int64N(2*cfg.driftPPM+1) - cfg.driftPPM,
			offset: time.Duration(s.rng.Int64N(int64(time.Hour))), // holders' clocks share no origin
			route:  append([]int32(nil), s.directory...),
			op:     -1,
		}
		s.push(event{at: s.between(0, 10*time.Millisecond), kind: evHolder, step: stAcquire, node: int32(i)})
	}
	s.push(event{at: s.exp(cfg.failoverEvery), kind: evCrash})
	s.push(event{at: s.exp(cfg.moveEvery), kind: evMove})
	s.push(event{at: s.exp(cfg.readEvery), kind: evRead})

	for len(s.q) > 0 {
		e := s.pop()
		s.now = e.at
		s.events++
		s.handle(e)
	}
	return result{log: s.log, final: s.finalState(), events: s.events}
}

// finalState reads every scope at its location once everything has
// stopped and every server is up again.
func (s *sim) finalState() []scopeState {
	final := make([]scopeState, s.cfg.scopes)
	for sc, k := range s.directory {
		// With asynchronous standbys the record may be absent or sealed
		// (a failover lost an install): whatever it holds is what the
		// checkers judge.
		r := s.res[k].primary[sc]
		final[sc] = scopeState{floor: r.floor, token: r.token, content: r.content}
	}
	// Everything shipped has arrived: a standby that differs from its
	// primary now is a bug of the simulator, not of the design.
	for k, n := range s.res {
		if !n.up || !slices.Equal(n.primary, n.standby) {
			panic(fmt.Sprintf("sim: resource server %d: down, or its standby differs from its primary after the run", k))
		}
	}
	for l, n := range s.lease {
		if !n.up || !slices.Equal(n.primary, n.standby) {
			panic(fmt.Sprintf("sim: lease server %d: down, or its standby differs from its primary after the run", l))
		}
	}
	return final
}

//go:norace
func (s *sim) handle(e event) {
	nres := int32(s.cfg.servers)
	switch e.kind {
	case evHolder:
		s.step(&s.holders[e.node], e.step)
	case evArrive:
		if e.node < nres {
			if !s.res[e.node].up {
				s.drop(e.m)
				return
			}
			s.serveResource(e.node, e.m)
		} else {
			if !s.lease[e.node-nres].up {
				s.drop(e.m)
				return
			}
			s.serveLease(e.node, e.m)
		}
	case evStandby:
		if e.node < nres {
			deliver(s, &s.res[e.node], e)
		} else {
			deliver(s, &s.lease[e.node-nres], e)
		}
	case evAck:
		if e.node < nres {
			acked(s, &s.res[e.node], e)
		} else {
			acked(s, &s.lease[e.node-nres], e)
		}
	case evReply:
		s.answer(e.m)
	case evTimeout:
		e.m.out = oUnknown
		s.answer(e.m)
	case evCrash:
		if s.stopping {
			return
		}
		id := s.rng.Int32N(nres + int32(s.cfg.leaseServers))
		if id < nres && s.res[id].up {
			crash(s, &s.res[id])
		} else if id >= nres && s.lease[id-nres].up {
			crash(s, &s.lease[id-nres])
		} else {
			id = -1 // already down: this failover does not happen
		}
		if id >= 0 {
			i := s.logOp(op{kind: kFailover, holder: -1, scope: -1, server: int8(id)})
			s.push(event{at: s.now + s.between(s.cfg.promoteMin, s.cfg.promoteMax), kind: evPromote, node: id, m: msg{op: i}})
		}
		s.push(event{at: s.now + s.exp(s.cfg.failoverEvery), kind: evCrash})
	case evPromote:
		s.log[e.m.op].ret, s.log[e.m.op].out = s.now, oOK
		if e.node < nres {
			promote(s, &s.res[e.node])
			// The auditor reads every scope of the server at once: an
			// acknowledged write the failover lost shows now, before the
			// holders write over it.
			for sc, k := range s.directory {
				if k == e.node {
					s.read(int32(sc), k)
				}
			}
		} else {
			promote(s, &s.lease[e.node-nres])
		}
	case evMove:
		s.startMove()
	case evInstall:
		s.install()
	case evRead:
		if s.stopping {
			return
		}
		sc := s.rng.Int32N(int32(s.cfg.scopes))
		s.read(sc, s.directory[sc])
		s.push(event{at: s.now + s.exp(s.cfg.readEvery), kind: evRead})
	}
}

//go:norace
func (s *sim) logOp(o op) int32 {
	o.invoke = s.now
	s.log = append(s.log, o)
	return int32(len(s.log) - 1)
}

//go:norace
func (s *sim) send(node int32, m msg) {
	m.sent = s.now
	s.push(event{at: s.now + s.between(s.cfg.netMin, s.cfg.netMax), kind: evArrive, node: node, m: m})
}

//go:norace
func (s *sim) reply(m msg) {
	s.push(event{at: s.now + s.between(s.cfg.netMin, s.cfg.netMax), kind: evReply, m: m})
}

// drop is a request that will never be answered: its client gives up when
// its timeout runs out.
//
//go:norace
func (s *sim) drop(m msg) {
	s.push(event{at: max(s.now, m.sent+s.cfg.timeout), kind: evTimeout, m: m})
}

// serveResource is resource server k answering a request. It reads and
// changes nothing but k's own record of the request's scope.
//
//go:norace
func (s *sim) serveResource(k int32, m msg) {
	n := &s.res[k]
	rec := n.primary[m.scope]
	switch m.kind {
	case kWrite:
		var v uint64
		m.out, v = rec.write(m.token, m.content)
		switch m.out {
		case oAccepted:
			commit(s, n, k, m.scope, rec, m)
			return
		case oRejected:
			m.floor = v
		case oMoved:
			m.to = int32(v)
		}
	case kRead:
		switch rec.state {
		case recOwned:
			m.out, m.floor, m.token, m.content = oOK, rec.floor, rec.token, rec.content
		case recSealed:
			m.out, m.to = oMoved, rec.movedTo
		default:
			m.out = oNotHere
		}
	case kSeal:
		switch {
		case rec.state == recOwned:
			m.out, m.floor, m.token, m.content = oOK, rec.floor, rec.token, rec.content
			if s.cfg.bug == bugMoveForgetsSeal {
				break // the data is copied, the old location left open
			}
			// From this change on, every write for the scope here is
			// answered "moved": the data and floor handed over are final.
			rec.state, rec.movedTo = recSealed, m.to
			commit(s, n, k, m.scope, rec, m)
			return
		case rec.state == recSealed && rec.movedTo == m.to:
			// A retry whose first answer a failover swallowed: the seal
			// is in place, and the sealed record still has the data.
			m.out, m.floor, m.token, m.content = oOK, rec.floor, rec.token, rec.content
		default:
			// Only with asynchronous standbys: a failover lost the
			// install that made this server the scope's location.
			m.out = oNotHere
		}
	case kInstall:
		m.out = oOK
		if rec.state == recOwned {
			break // a retry whose first answer a failover swallowed
		}
		rec = scopeRec{state: recOwned, floor: m.floor, token: m.token, content: m.content}
		commit(s, n, k, m.scope, rec, m)
		return
	}
	s.reply(m)
}

// serveLease is a lease server answering a holder; expiry is by the
// server's clock (the virtual clock: servers' clocks are exact, and a
// promoted standby's clock is the old primary's).
//
//go:norace
func (s *sim) serveLease(id int32, m msg) {
	n := &s.lease[id-int32(s.cfg.servers)]
	rec := n.primary[m.scope]
	held := rec.holder >= 0 && s.now < rec.expiry
	mine := held && rec.holder == m.client && rec.token == m.token
	switch m.kind {
	case kAcquire:
		if held {
			m.out = oHeld
			break
		}
		rec.counter++
		rec.holder, rec.token, rec.expiry = m.client, rec.counter, s.now+s.cfg.ttl
		m.out, m.token = oOK, rec.token
		commit(s, n, id, m.scope, rec, m)
		return
	case kRenew:
		if !mine {
			m.out = oLost
			break
		}
		rec.expiry = s.now + s.cfg.ttl
		m.out = oOK
		commit(s, n, id, m.scope, rec, m)
		return
	case kRelease:
		if !mine {
			m.out = oLost
			break
		}
		rec.holder = -1
		m.out = oOK
		commit(s, n, id, m.scope, rec, m)
		return
	}
	s.reply(m)
}

//go:norace
func (s *sim) answer(m msg) {
	switch m.client {
	case cAuditor:
		o := &s.log[m.op]
		o.ret, o.out = s.now, m.out
		switch m.out {
		case oOK:
			o.floor, o.token, o.content = m.floor, m.token, m.content
		case oMoved:
			o.peer = int8(m.to)
			if m.hops < maxHops {
				s.readHop(m.scope, m.to, m.hops+1)
			}
		}
	case cMover:
		s.moverAnswer(m)
	default:
		s.holderAnswer(&s.holders[m.client], m)
	}
}

// read is the auditor reading a scope at a server.
//
//go:norace
func (s *sim) read(scope, k int32) { s.readHop(scope, k, 0) }

// maxHops bounds the redirects a read or a write follows: with
// asynchronous standbys a failover can lose the install that replaced a
// seal and leave two servers each saying the scope moved to the other.
const maxHops = 4

//go:norace
func (s *sim) readHop(scope, k int32, hops uint8) {
	i := s.logOp(op{kind: kRead, holder: -1, scope: int16(scope), server: int8(k)})
	s.send(k, msg{op: i, client: cAuditor, scope: scope, kind: kRead, hops: hops})
}

// ---- Holders ----

type step uint8

const (
	stAcquire step = iota // pick a scope and acquire its lease
	stNext                // holding: renew, release, or work towards the next write
	stCheck               // the work is done: check the lease, then write (or pause first)
	stSend                // after a pause or a redirect: write, without another look at the lease
	stRetry               // the scope is not installed yet: check the lease, write to its location
)

// holder is one client process. Its clock drifts; its local deadline is
// the local time read before the acquire or renew was sent, plus TTL,
// minus the margin.
type holder struct {
	id       int32
	ppm      int64
	offset   time.Duration
	route    []int32 // its cached routing table, refreshed when told or at some acquires
	scope    int32
	token    uint64 // 0: holds nothing
	deadline time.Duration
	renewAt  time.Duration
	asked    time.Duration // local time the outstanding acquire or renew was sent
	writes   int           // left in this holding
	hops     int           // redirects the current write followed
	op       int32         // the outstanding request's log entry, -1 none
}

//go:norace
func (h *holder) local(now time.Duration) time.Duration {
	return h.offset + now + time.Duration(int64(now)*h.ppm/1_000_000)
}

//go:norace
func (s *sim) wake(h *holder, st step, after time.Duration) {
	s.push(event{at: s.now + after, kind: evHolder, step: st, node: h.id})
}

//go:norace
func (s *sim) backoff() time.Duration { return s.between(0, s.cfg.backoffMax) }

// lost is the holder giving its lease up as lost (its deadline passed, a
// renewal or a write was refused): it campaigns again after a backoff.
//
//go:norace
func (s *sim) lost(h *holder) {
	h.token = 0
	s.wake(h, stAcquire, s.backoff())
}

//go:norace
func (s *sim) step(h *holder, st step) {
	if s.stopping {
		return // the budget is spent; a lease held lapses by itself
	}
	switch st {
	case stAcquire:
		h.scope = s.rng.Int32N(int32(s.cfg.scopes))
		if s.rng.Float64() < s.cfg.refreshProb {
			h.route[h.scope] = s.directory[h.scope]
		}
		h.asked = h.local(s.now)
		s.request(h, kAcquire, s.leaseServer(h.scope), 0)
	case stNext:
		switch now := h.local(s.now); {
		case now >= h.deadline:
			s.lost(h)
		case h.writes == 0:
			s.request(h, kRelease, s.leaseServer(h.scope), 0)
		case now >= h.renewAt:
			h.asked = now
			s.request(h, kRenew, s.leaseServer(h.scope), 0)
		default:
			s.wake(h, stCheck, s.between(s.cfg.workMin, s.cfg.workMax))
		}
	case stCheck:
		// The check: the holder's last look at its lease before the write.
		if h.local(s.now) >= h.deadline {
			s.lost(h)
			return
		}
		h.hops = 0
		if s.rng.Float64() < s.cfg.pauseProb {
			// The stale holder of the lease-fencing article (SOURCES.md):
			// frozen after its check, its renewals stop with it, and it
			// sends the write it had decided on the moment it wakes.
			d := s.between(0, s.cfg.shortMax)
			if s.rng.Float64() < s.cfg.longShare {
				d = s.between(s.cfg.longMin, s.cfg.longMax)
			}
			i := s.logOp(op{kind: kPause, holder: int16(h.id), scope: int16(h.scope), token: h.token})
			s.log[i].ret, s.log[i].out = s.now+d, oOK
			s.wake(h, stSend, d)
			return
		}
		s.write(h)
	case stSend:
		s.write(h)
	case stRetry:
		if h.local(s.now) >= h.deadline {
			s.lost(h)
			return
		}
		h.hops = 0
		s.write(h)
	}
}

//go:norace
func (s *sim) leaseServer(name int32) int32 {
	return int32(s.cfg.servers) + name%int32(s.cfg.leaseServers)
}

//go:norace
func (s *sim) write(h *holder) {
	s.content++
	s.request(h, kWrite, h.route[h.scope], s.content)
}

//go:norace
func (s *sim) request(h *holder, kind opKind, node int32, content uint64) {
	h.op = s.logOp(op{kind: kind, token: h.token, content: content, holder: int16(h.id), scope: int16(h.scope), server: int8(node)})
	s.send(node, msg{op: h.op, client: h.id, scope: h.scope, token: h.token, content: content, kind: kind})
	if kind == kRelease {
		return // releases are logged and counted, outside the budget
	}
	if s.issued++; s.issued >= s.cfg.ops {
		s.stopping = true
	}
}

//go:norace
func (s *sim) holderAnswer(h *holder, m msg) {
	if m.op != h.op {
		panic(fmt.Sprintf("sim: holder %d got the answer to op %d while waiting for op %d", h.id, m.op, h.op))
	}
	h.op = -1
	o := &s.log[m.op]
	o.ret, o.out = s.now, m.out
	switch m.kind {
	case kAcquire:
		if m.out != oOK {
			s.wake(h, stAcquire, s.backoff()) // held, or unknown: a grant it never heard of lapses by itself
			return
		}
		o.token = m.token
		h.token, h.writes = m.token, s.cfg.writesMin+s.rng.IntN(s.cfg.writesMax-s.cfg.writesMin+1)
		h.deadline, h.renewAt = h.asked+s.cfg.ttl-s.cfg.margin, h.asked+s.cfg.renewEvery
		s.step(h, stNext)
	case kRenew:
		switch m.out {
		case oOK:
			h.deadline, h.renewAt = h.asked+s.cfg.ttl-s.cfg.margin, h.asked+s.cfg.renewEvery
			s.step(h, stNext)
		case oLost:
			s.lost(h)
		default: // unknown: the old deadline stands; the next step renews again
			s.step(h, stNext)
		}
	case kRelease:
		h.token = 0
		s.wake(h, stAcquire, s.backoff())
	case kWrite:
		switch m.out {
		case oAccepted, oUnknown:
			h.writes--
			s.step(h, stNext)
		case oRejected:
			o.floor = m.floor
			s.lost(h) // a newer holder wrote: this lease is over
		case oMoved:
			// The client's routing layer follows the redirect at once,
			// as a driver would: the holder does not look at its lease
			// again, so a stale write stays stale at the new location,
			// where only the floor that moved with the data stops it.
			o.peer = int8(m.to)
			h.route[h.scope] = m.to
			if h.hops++; h.hops <= maxHops {
				s.wake(h, stSend, 0)
				break
			}
			fallthrough // a cycle of redirects (asynchronous standbys only): wait as for "not here"
		case oNotHere:
			// Moved here but not installed yet: ask the routing table
			// again in a moment, checking the lease before the retry
			// (a wait, unlike a redirect).
			h.route[h.scope] = s.directory[h.scope]
			s.wake(h, stRetry, s.between(s.cfg.workMin, s.cfg.workMax))
		}
	}
}

// ---- The mover ----

// mover moves one scope at a time: it seals the scope at its old location
// (which answers "moved" from then on and hands over the data and the
// floor, final from that moment), copies them, installs them at the new
// location (which starts accepting with that floor in the same step), and
// only then points the routing table at the new location. Each step is a
// committed change at one server; the write path takes part in none.
type mover struct {
	scope, from, to int32
	op              int32
	snap            msg // the seal's answer: the data and floor to install
}

func (s *sim) startMove() {
	if s.stopping {
		return
	}
	sc := s.rng.Int32N(int32(s.cfg.scopes))
	from := s.directory[sc]
	to := (from + 1 + s.rng.Int32N(int32(s.cfg.servers-1))) % int32(s.cfg.servers)
	s.mv = mover{scope: sc, from: from, to: to}
	s.mv.op = s.logOp(op{kind: kMove, holder: -1, scope: int16(sc), server: int8(from), peer: int8(to)})
	s.send(from, msg{op: s.mv.op, client: cMover, scope: sc, to: to, kind: kSeal})
}

func (s *sim) install() {
	m := s.mv.snap
	floor := m.floor
	if s.cfg.bug == bugMoveForgetsFloor {
		floor = 0 // the seeded bug: the data moves, its floor does not
	}
	s.send(s.mv.to, msg{op: s.mv.op, client: cMover, scope: s.mv.scope, kind: kInstall, floor: floor, token: m.token, content: m.content})
}

func (s *sim) moverAnswer(m msg) {
	if m.out == oUnknown {
		// A failover swallowed the request or its answer: both steps are
		// idempotent, so send it again.
		to := s.mv.from
		if m.kind == kInstall {
			to = s.mv.to
		}
		m.out = oPending
		s.send(to, m)
		return
	}
	switch m.kind {
	case kSeal:
		if m.out == oNotHere {
			// Only with asynchronous standbys (see serveResource): the
			// scope is lost at its location; this move is abandoned.
			o := &s.log[s.mv.op]
			o.ret, o.out = s.now, oNotHere
			s.push(event{at: s.now + s.exp(s.cfg.moveEvery), kind: evMove})
			return
		}
		s.mv.snap = m
		s.push(event{at: s.now + s.between(s.cfg.copyMin, s.cfg.copyMax), kind: evInstall})
	case kInstall:
		s.directory[s.mv.scope] = s.mv.to
		o := &s.log[s.mv.op]
		o.ret, o.out, o.floor, o.token, o.content = s.now, oOK, m.floor, m.token, m.content
		if !s.stopping {
			s.push(event{at: s.now + s.exp(s.cfg.moveEvery), kind: evMove})
		}
	}
}

// ---- Randomness ----

//go:norace
func (s *sim) between(a, b time.Duration) time.Duration {
	return a + time.Duration(s.rng.Int64N(int64(b-a)+1))
}

//go:norace
func (s *sim) exp(mean time.Duration) time.Duration {
	return time.Duration(s.rng.ExpFloat64() * float64(mean))
}
