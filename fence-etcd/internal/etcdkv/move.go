package etcdkv

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Moved is the key of scope's seal record (SealRecord): written, with the
// floor raised to leasecore.SealedFloor, by the transaction that seals the
// scope at a cluster it moves away from (fenceetcd.Fence.Seal). A key of its
// own, like FloorSpace, because Fence.Guard compares the floor's whole
// value: the floor stays a bare encoded token.
func (l Layout) Moved(scope string) string { return l.key("moved", scope) }

// SealRecord is the value of a Moved key: where the scope went, and its
// floor and that floor's token space when it was sealed.
//
// The sealing transaction cannot know the floor it replaces (it reads it
// in the same step), so it writes a record with Pending set and no floor;
// a second transaction completes it from what the first one read. A
// pending record found later (the sealer stopped between the two) is
// completed from the floor's value just before the seal's revision.
type SealRecord struct {
	To      string `json:"to"`
	Floor   uint64 `json:"floor"`
	Space   string `json:"space,omitempty"`
	Pending bool   `json:"pending,omitempty"`
	// At is the sealer's clock when it built the request: etcd stores no
	// time of its own. For operators reading the key.
	At time.Time `json:"at"`
}

// NewSealRecord returns the record of seal s, stamped with the local clock.
func NewSealRecord(s leasecore.ScopeSeal) SealRecord {
	return SealRecord{To: s.To, Floor: uint64(s.Floor), Space: s.Space, At: time.Now().UTC()}
}

// Encode returns the record as JSON.
func (r SealRecord) Encode() string { return mustJSON(r) }

// ScopeSeal returns the seal the record describes for scope.
func (r SealRecord) ScopeSeal(scope string) leasecore.ScopeSeal {
	return leasecore.ScopeSeal{Scope: scope, To: r.To, Floor: leasecore.Token(r.Floor), Space: r.Space}
}

// DecodeSeal parses the value of a Moved key. A record that does not
// describe a seal (no destination, a floor that is no token) is an error:
// the key was written outside the fence.
func DecodeSeal(key string, value []byte) (SealRecord, error) {
	var r SealRecord
	if err := json.Unmarshal(value, &r); err != nil {
		return SealRecord{}, fmt.Errorf("key %q does not hold a seal record: %w", key, err)
	}
	if r.To == "" || leasecore.Token(r.Floor) > backendkit.MaxToken {
		return SealRecord{}, fmt.Errorf("key %q does not hold a seal record: %s", key, value)
	}
	return r, nil
}

// PartPrefix is the prefix of every part key of scope, "/" included: what
// a mover reads to copy a scope's parts.
func (l Layout) PartPrefix(scope string) string { return l.key("part", scope) + "/" }
