package fencepg

import (
	"sync"

	"github.com/leasefence/leasefence/leasecore"
)

// seenFloors remembers, per scope, the token this Fence last saw the
// scope's floor at: the token it raised the floor to, or whose
// transaction it committed. RunTx (either fence's) skips its early read of
// the floor for a claim whose token is remembered (the holder's second and
// later transactions), since what the read is for is then known: floors
// only go up, so the floor is at least that token (older holders are cut
// off), and a newer token that passed it since is caught by the comparison
// at commit (the early read only rejects such a token sooner). It is a
// hint, never what a decision rests on.
type seenFloors struct {
	mu sync.Mutex
	m  map[string]leasecore.Token
}

// maxSeenFloors bounds the memory of seenFloors: when it holds this many
// scopes it starts again empty (a forgotten scope costs one early read).
const maxSeenFloors = 10000

// at reports whether the floor of scope was last seen at token.
func (s *seenFloors) at(scope string, token leasecore.Token) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[scope] == token
}

// saw records that the floor of scope was at token.
func (s *seenFloors) saw(scope string, token leasecore.Token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxSeenFloors {
		s.m = make(map[string]leasecore.Token)
	}
	s.m[scope] = token
}
