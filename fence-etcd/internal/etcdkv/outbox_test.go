package etcdkv

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
)

func TestOutboxRecord(t *testing.T) {
	l, err := NewLayout("test", Options{Prefix: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	c := leasecore.Claim{Scope: "a/b %", Writer: "w", Token: 7}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	var keys []string
	for i := range 100 {
		rec := NewOutboxRecord(c, "topic")
		if !uuid.MatchString(rec.ID) {
			t.Fatalf("id %q is not a version-4 UUID", rec.ID)
		}
		key := l.OutboxKey(rec)
		if !strings.HasPrefix(key, "/p/outbox/a%2Fb%20%25/") || !strings.HasSuffix(key, "-"+rec.ID) {
			t.Fatalf("key %q", key)
		}
		keys = append(keys, key)
		payload := []byte{byte(i), '\n', 0, '\n'}
		e, err := DecodeOutbox(key, []byte(rec.Encode(payload)), 42)
		if err != nil {
			t.Fatal(err)
		}
		if e.ID != rec.ID || e.Seq != 42 || e.Scope != c.Scope || e.Writer != "w" || e.Token != 7 || e.Topic != "topic" ||
			string(e.Payload) != string(payload) || e.At.IsZero() {
			t.Fatalf("decoded %+v", e)
		}
	}
	// Built one after the other, the keys sort in that order: the
	// entries of one Txn keep the order their operations were built in.
	if !slices.IsSorted(keys) {
		t.Fatalf("keys out of order: %q", keys)
	}
	if _, err := DecodeOutbox("k", []byte(`{"id":"x"}`), 1); err == nil {
		t.Fatal("a value without the newline decoded")
	}
}
