package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"
)

// The operation log is the only thing the checkers see of a run, with the
// final state: they do not look at the simulator's servers, holders or
// queue, so a bug in the simulator's bookkeeping cannot hide a violation
// from them.

// opKind is what an operation of the log did.
type opKind uint8

const (
	kAcquire  opKind = iota + 1 // a holder asks the lease service for a name
	kRenew                      // a holder extends its lease
	kRelease                    // a holder gives its lease back
	kWrite                      // a holder writes a scope with its token
	kRead                       // the auditor reads a scope's floor and data
	kPause                      // a holder frozen between its check and its write (not a request)
	kMove                       // the mover moves a scope from one server to another (not checked)
	kFailover                   // a server's primary crashed; its standby was promoted (not checked)

	// The mover's two requests; they are logged as one kMove, not by
	// themselves.
	kSeal    // the old location: stop accepting the scope and hand over its data and floor
	kInstall // the new location: take the data and the floor and start accepting
)

var kindNames = [...]string{
	kAcquire: "acquire", kRenew: "renew", kRelease: "release", kWrite: "write", kRead: "read",
	kPause: "pause", kMove: "move", kFailover: "failover", kSeal: "seal", kInstall: "install",
}

func (k opKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// outcome is what the client of an operation learnt.
type outcome uint8

const (
	oPending  outcome = iota // no answer yet: never left in a finished log
	oOK                      // acquire granted (token in op.token), renew or release done, read answered
	oHeld                    // acquire refused: someone else holds the name
	oLost                    // renew or release refused: the lease is no longer the holder's
	oAccepted                // write accepted by the fence
	oRejected                // write refused: its token is below the floor (op.floor)
	oMoved                   // the server no longer holds the scope: it moved to op.peer
	oNotHere                 // the server does not hold the scope (yet): ask the routing table again
	oUnknown                 // no answer (the server failed over): it may have taken effect
)

var outcomeNames = [...]string{
	oPending: "pending", oOK: "ok", oHeld: "held", oLost: "lost", oAccepted: "accepted",
	oRejected: "rejected", oMoved: "moved", oNotHere: "not here", oUnknown: "unknown",
}

func (o outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// op is one operation of the log, appended when it is invoked (the request
// leaves the client) and completed when its answer arrives or the client
// gives up. Plain values, no pointers: a run logs over a million of them
// and the garbage collector need not scan them.
type op struct {
	invoke, ret time.Duration // virtual time; ret is when the client gave up for an unknown outcome
	token       uint64        // acquire: the token granted; renew, release, write: the holder's token; read: the data's token
	floor       uint64        // rejected write: the floor that beat it; read: the floor seen; move: the floor handed over
	content     uint64        // write: its content, unique in the run; read: the content seen
	holder      int16         // the holder; -1 for the auditor and the mover
	scope       int16         // the scope; for acquire, renew and release the lease name, which is the scope's
	server      int8          // the server the request went to (lease servers after the resource servers); move: from
	peer        int8          // moved: where the scope went; move: to
	kind        opKind
	out         outcome
}

func (o op) String() string {
	who := fmt.Sprintf("holder %d", o.holder)
	if o.holder < 0 {
		who = "auditor"
	}
	switch o.kind {
	case kAcquire:
		return fmt.Sprintf("%s acquire of name %d at server %d: %v token %d [%v, %v]", who, o.scope, o.server, o.out, o.token, o.invoke, o.ret)
	case kWrite:
		s := fmt.Sprintf("%s write #%d token %d to scope %d at server %d: %v [%v, %v]", who, o.content, o.token, o.scope, o.server, o.out, o.invoke, o.ret)
		if o.out == oRejected {
			s += fmt.Sprintf(" (floor %d)", o.floor)
		}
		return s
	case kRead:
		return fmt.Sprintf("%s read of scope %d at server %d: %v floor %d, data #%d token %d [%v, %v]", who, o.scope, o.server, o.out, o.floor, o.content, o.token, o.invoke, o.ret)
	}
	return fmt.Sprintf("%s %v scope %d token %d at server %d: %v [%v, %v]", who, o.kind, o.scope, o.token, o.server, o.out, o.invoke, o.ret)
}

// scopeState is a scope's final state at its location after the run: the
// floor and the data (the token and content of the write it holds).
type scopeState struct {
	floor, token, content uint64
}

// logHash fingerprints a run: the same seed and configuration must give the
// same log and final state, bit for bit.
func logHash(log []op, final []scopeState) [32]byte {
	h := sha256.New()
	var b [48]byte
	for _, o := range log {
		binary.LittleEndian.PutUint64(b[0:], uint64(o.invoke))
		binary.LittleEndian.PutUint64(b[8:], uint64(o.ret))
		binary.LittleEndian.PutUint64(b[16:], o.token)
		binary.LittleEndian.PutUint64(b[24:], o.floor)
		binary.LittleEndian.PutUint64(b[32:], o.content)
		binary.LittleEndian.PutUint16(b[40:], uint16(o.holder))
		binary.LittleEndian.PutUint16(b[42:], uint16(o.scope))
		b[44], b[45], b[46], b[47] = byte(o.server), byte(o.peer), byte(o.kind), byte(o.out)
		h.Write(b[:])
	}
	for _, f := range final {
		binary.LittleEndian.PutUint64(b[0:], f.floor)
		binary.LittleEndian.PutUint64(b[8:], f.token)
		binary.LittleEndian.PutUint64(b[16:], f.content)
		h.Write(b[:24])
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// figures counts a log's operations.
type figures struct {
	ops                                           int // acquire + renew + write requests: the budget counts these
	acquires, granted, held                       int
	renews, releases                              int
	writes, accepted, rejected, moved, notHere    int
	unknown                                       int // holder operations without an answer (failovers)
	reads, pauses, longPauses, failovers, moves   int
	virtual                                       time.Duration
	leaseFailovers, resourceFailovers, movedFloor int
}

// countLog computes the figures; longPause is the pause length from which a
// pause counts as long (it outlives the lease).
func countLog(log []op, servers int, longPause time.Duration) figures {
	var f figures
	for _, o := range log {
		f.virtual = max(f.virtual, o.invoke, o.ret)
		switch o.kind {
		case kAcquire, kRenew, kWrite:
			f.ops++
		}
		switch o.kind {
		case kAcquire, kRenew, kRelease, kWrite:
			if o.out == oUnknown {
				f.unknown++
			}
		}
		switch o.kind {
		case kAcquire:
			f.acquires++
			switch o.out {
			case oOK:
				f.granted++
			case oHeld:
				f.held++
			}
		case kRenew:
			f.renews++
		case kRelease:
			f.releases++
		case kWrite:
			f.writes++
			switch o.out {
			case oAccepted:
				f.accepted++
			case oRejected:
				f.rejected++
			case oMoved:
				f.moved++
			case oNotHere:
				f.notHere++
			}
		case kRead:
			f.reads++
		case kPause:
			f.pauses++
			if o.ret-o.invoke >= longPause {
				f.longPauses++
			}
		case kFailover:
			f.failovers++
			if int(o.server) < servers {
				f.resourceFailovers++
			} else {
				f.leaseFailovers++
			}
		case kMove:
			f.moves++
			if o.floor > 0 {
				f.movedFloor++
			}
		}
	}
	return f
}
