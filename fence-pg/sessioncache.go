package fencepg

import (
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// verifiedSessions is what a LeaseStore with holder sessions knows from
// its full renewals (RenewAllSession): for each holder and TTL, the names
// and tokens it found on the holder's session, and the session's id and
// generation in the same snapshot. As long as the session row still shows
// that id and generation, those names are all still on it with those
// tokens (the generation grows with every name that leaves the session or
// changes its holding period; see schema/lease.sql), so RenewAll of any of
// them is one UPDATE of the session row (RenewSessionGeneration).
//
// It is only ever a reason to skip reading lease rows, never a reason to
// report a name renewed: the UPDATE that compares the generation decides,
// and every doubt (a name not in the set, another token, a failed UPDATE)
// sends the renewal to the full check, which refreshes the entry.
type verifiedSessions struct {
	mu      sync.Mutex
	entries map[sessionKey]*verifiedSession
	swept   int // len(entries) after the last sweep
}

type sessionKey struct {
	holder string
	ttl    time.Duration
}

type verifiedSession struct {
	sessionID  string
	generation int64
	tokens     map[string]leasecore.Token
	used       time.Time // the last renewal that noted or used it
}

// sessionSeen is a session RenewAllSession extended, as its snapshot
// showed it.
type sessionSeen struct {
	ttlUs      int64
	sessionID  string
	generation int64
}

// covering returns the entry of gs's holder and TTL when it has every grant
// of gs with the grant's token: gs is one holder's (CheckRenewAll), and the
// fast path wants one TTL, so grants of several TTLs take the full check.
func (v *verifiedSessions) covering(gs []leasecore.Grant) (verifiedSession, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.entries[sessionKey{gs[0].Holder, gs[0].TTL}]
	if e == nil {
		return verifiedSession{}, false
	}
	for _, g := range gs {
		if g.TTL != gs[0].TTL || e.tokens[g.Name] != g.Token {
			return verifiedSession{}, false
		}
	}
	e.used = time.Now()
	return verifiedSession{sessionID: e.sessionID, generation: e.generation}, true
}

// forget drops the entry of (holder, ttl) if it is still the one the fast
// path used (a concurrent full check may have replaced it by a newer one).
func (v *verifiedSessions) forget(holder string, ttl time.Duration, used verifiedSession) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := sessionKey{holder, ttl}
	if e := v.entries[k]; e != nil && e.sessionID == used.sessionID && e.generation == used.generation {
		delete(v.entries, k)
	}
}

// note records what a full check found: for each session it extended, the
// renewed grants of that TTL were on it at that generation. An entry of
// the same session and generation gains them (two sets of one holder on one
// store); any other entry is replaced, since it is at best as recent.
func (v *verifiedSessions) note(holder string, renewed []leasecore.Grant, seen []sessionSeen, now time.Time) {
	if len(seen) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.entries == nil {
		v.entries = map[sessionKey]*verifiedSession{}
	}
	for _, ss := range seen {
		ttl := time.Duration(ss.ttlUs) * time.Microsecond
		k := sessionKey{holder, ttl}
		e := v.entries[k]
		if e == nil || e.sessionID != ss.sessionID || e.generation != ss.generation {
			e = &verifiedSession{sessionID: ss.sessionID, generation: ss.generation, tokens: map[string]leasecore.Token{}}
			v.entries[k] = e
		}
		e.used = now
		for _, g := range renewed {
			if g.Name != "" && g.TTL == ttl {
				e.tokens[g.Name] = g.Token
			}
		}
	}
	v.sweepLocked(now)
}

// sweepLocked drops, once the map has doubled since the last sweep, the
// entries of holders that renewed nothing through this store for longer
// than their TTL: their sessions have expired by now, so the fast path
// would fail anyway. It keeps a long-lived store with short-lived holders
// from growing without bound.
func (v *verifiedSessions) sweepLocked(now time.Time) {
	if len(v.entries) < 2*v.swept+64 {
		return
	}
	for k, e := range v.entries {
		if now.Sub(e.used) > k.ttl {
			delete(v.entries, k)
		}
	}
	v.swept = len(v.entries)
}
