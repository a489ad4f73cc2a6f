package etcdkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// TestTokenEncodingOrder: the byte order of encoded tokens is their
// numeric order, which is what the floor compare relies on.
func TestTokenEncodingOrder(t *testing.T) {
	edges := []leasecore.Token{1, 2, 9, 10, 11, 99, 100, 101, 999, 1000, 1 << 31, 1 << 32, 1<<53 + 1,
		backendkit.MaxToken - 1, backendkit.MaxToken, backendkit.MaxToken + 1, math.MaxUint64}
	r := rand.New(rand.NewPCG(1, 2))
	values := append([]leasecore.Token(nil), edges...)
	for range 2000 {
		values = append(values, leasecore.Token(r.Uint64()>>r.IntN(64)))
	}
	for i, a := range values {
		ea := EncodeToken(a)
		if len(ea) != 20 {
			t.Fatalf("EncodeToken(%d) = %q: not 20 bytes", a, ea)
		}
		if got, err := DecodeToken(ea); err != nil || got != a {
			t.Fatalf("DecodeToken(EncodeToken(%d)) = %d, %v", a, got, err)
		}
		b := values[(i*7+3)%len(values)]
		eb := EncodeToken(b)
		if want, got := cmp(a, b), strings.Compare(ea, eb); want != got {
			t.Fatalf("%d vs %d: numeric order %d, byte order of %q vs %q is %d", a, b, want, ea, eb, got)
		}
	}
	if got := EncodeToken(5); got != "00000000000000000005" {
		t.Fatalf("EncodeToken(5) = %q", got)
	}
}

func cmp(a, b leasecore.Token) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestDecodeTokenRejects(t *testing.T) {
	for _, s := range []string{"", "5", "0000000000000000005", "000000000000000000005", "0000000000000000000x",
		"-0000000000000000005", "99999999999999999999", " 0000000000000000005"} {
		if got, err := DecodeToken(s); err == nil {
			t.Errorf("DecodeToken(%q) = %d, want an error", s, got)
		}
	}
}

// TestFloorSpaceEncoding: a floor's token-space value carries the token it
// belongs to and the space, whatever the space holds (spaces are
// identifiers: no control characters, but spaces inside are allowed), and
// anything else is refused.
func TestFloorSpaceEncoding(t *testing.T) {
	for _, space := range []string{"etcd:8e9e05c52164694d", "postgres:6f1c3e2a-0b7d-4c55-9a43-2f0f4b8f6d11", "a b"} {
		v := EncodeFloorSpace(16, space)
		if tok, got, err := DecodeFloorSpace(v); err != nil || tok != 16 || got != space {
			t.Errorf("DecodeFloorSpace(%q) = %d, %q, %v", v, tok, got, err)
		}
	}
	for _, v := range []string{"", EncodeToken(16), EncodeToken(16) + " ", "16 etcd:1", "x" + EncodeToken(16)[1:] + " etcd:1"} {
		if tok, space, err := DecodeFloorSpace(v); err == nil {
			t.Errorf("DecodeFloorSpace(%q) = %d, %q, want an error", v, tok, space)
		}
	}
}

func TestLayout(t *testing.T) {
	l, err := NewLayout("test", Options{Prefix: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{
		{l.Lease("daily-report"), "/p/lease/daily-report"},
		{l.Lease("a/b"), "/p/lease/a%2Fb"},
		{l.Lease("100%"), "/p/lease/100%25"},
		{l.Floor("日报 x"), "/p/floor/%E6%97%A5%E6%8A%A5%20x"},
		{l.Part("a/b", "c"), "/p/part/a%2Fb/c"},
		{l.Part("a", "b/c"), "/p/part/a/b%2Fc"},
		{l.AttemptPrefix("a"), "/p/attempt/a/"},
		{l.FloorSpace("a/b"), "/p/floorspace/a%2Fb"},
		{l.Moved("a/b"), "/p/moved/a%2Fb"},
		{l.PartToken("s", "p"), "/p/parttoken/s/p"},
		{l.Published("s", "p"), "/p/published/s/p"},
		{l.HolderGen("h/1", 0x694d9a1b2c3d4e5f), "/p/holdergen/h%2F1/694d9a1b2c3d4e5f"},
		{l.HolderGen("h", 7), "/p/holdergen/h/0000000000000007"},
		{l.HolderGenPrefix("h/1"), "/p/holdergen/h%2F1/"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	// Two scopes whose names share a prefix have disjoint attempt ranges.
	now := time.Now()
	if a, ab := l.NewAttempt("a", now), l.AttemptPrefix("a/b"); strings.HasPrefix(a, ab) || strings.HasPrefix(ab, l.AttemptPrefix("a")) {
		t.Errorf("attempt ranges of a and a/b overlap: %q, %q", a, ab)
	}
	// Attempt keys: time-ordered, distinct within one nanosecond.
	at := time.Unix(1700000000, 5)
	k1, k2 := l.NewAttempt("s", at), l.NewAttempt("s", at)
	if k1 == k2 || !regexp.MustCompile(`^/p/attempt/s/01700000000000000005-[0-9a-f]{8}$`).MatchString(k1) {
		t.Errorf("attempt keys %q, %q: want distinct /p/attempt/s/<20-digit ns>-<8 hex>", k1, k2)
	}
	if bound := l.AttemptsAt("s", at); !strings.HasPrefix(k1, bound) || !(bound < k1) ||
		!(l.NewAttempt("s", at.Add(-1)) < bound) || !(k1 < l.AttemptsAt("s", at.Add(1))) {
		t.Errorf("attempt key %q is not bounded by AttemptsAt %q", k1, bound)
	}
	if got := l.AttemptsAt("s", time.Time{}); got != "/p/attempt/s/00000000000000000000" {
		t.Errorf("AttemptsAt(zero time) = %q", got)
	}
	if got := l.Fenced(); strings.Join(got, " ") != "/p/floor/ /p/floorspace/ /p/attempt/ /p/moved/" {
		t.Errorf("Fenced() = %q", got)
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, p := range []string{"/leasefence", "/a", "/a/b", "/leasefence-test/0123456789abcdef", "/日报"} {
		if err := CheckPrefix("test", p); err != nil {
			t.Errorf("CheckPrefix(%q): %v", p, err)
		}
	}
	for p, mention := range map[string]string{
		"":             "must not be empty",
		"leasefence":   `must begin with "/"`,
		"/leasefence/": `must not end with "/"`,
		"/":            `must not end with "/"`,
		" /a":          "whitespace",
		"/a\nb":        "control character",
		"/a\x00":       "control character",
		"/a\xff":       "UTF-8",
		"/" + strings.Repeat("p", backendkit.MaxNameLen): "longer than",
	} {
		err := CheckPrefix("new resource", p)
		var ae *leasecore.ArgError
		if !errors.As(err, &ae) || ae.Field != "prefix" || ae.Op != "new resource" ||
			!errors.Is(err, leasecore.ErrInvalidArgument) || !strings.Contains(err.Error(), mention) {
			t.Errorf("CheckPrefix(%q) = %v, want an ArgError for prefix mentioning %q", p, err, mention)
		}
	}
}

// TestMapError classifies the errors the etcd client returns. The paths
// that need a server (a refused oversized request, an unreachable server)
// are tested in package fenceetcd.
func TestMapError(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(live)
	cancel2()

	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // nil: wrapped as it is
	}{
		{"no leader", live, rpctypes.ErrNoLeader, leasecore.ErrUnavailable},
		{"leader changed", live, rpctypes.ErrLeaderChanged, leasecore.ErrUnavailable},
		{"server stopped", live, rpctypes.ErrStopped, leasecore.ErrUnavailable},
		{"request timed out", live, rpctypes.ErrTimeout, leasecore.ErrUnavailable},
		{"timed out, leader fail", live, rpctypes.ErrTimeoutDueToLeaderFail, leasecore.ErrUnavailable},
		{"timed out, connection lost", live, rpctypes.ErrTimeoutDueToConnectionLost, leasecore.ErrUnavailable},
		{"unhealthy", live, rpctypes.ErrUnhealthy, leasecore.ErrUnavailable},
		{"too many requests", live, rpctypes.ErrTooManyRequests, leasecore.ErrUnavailable},
		{"no space", live, rpctypes.ErrNoSpace, leasecore.ErrUnavailable},
		{"gRPC unavailable", live, status.Error(codes.Unavailable, "connection refused"), leasecore.ErrUnavailable},
		{"wrapped gRPC unavailable", live, fmt.Errorf("x: %w", status.Error(codes.Unavailable, "eof")), leasecore.ErrUnavailable},
		{"server deadline, ctx live", live, status.Error(codes.DeadlineExceeded, "deadline"), leasecore.ErrUnavailable},
		{"lease not found", live, rpctypes.ErrLeaseNotFound, leasecore.ErrLost},
		{"gRPC lease not found", live, rpctypes.ErrGRPCLeaseNotFound, leasecore.ErrLost},
		{"request too large", live, rpctypes.ErrRequestTooLarge, leasecore.ErrInvalidArgument},
		{"gRPC request too large", live, rpctypes.ErrGRPCRequestTooLarge, leasecore.ErrInvalidArgument},
		{"too many operations", live, rpctypes.ErrTooManyOps, leasecore.ErrInvalidArgument},
		{"gRPC too many operations", live, rpctypes.ErrGRPCTooManyOps, leasecore.ErrInvalidArgument},
		{"duplicate key", live, rpctypes.ErrDuplicateKey, leasecore.ErrInvalidArgument},
		{"empty key", live, rpctypes.ErrEmptyKey, leasecore.ErrInvalidArgument},
		{"empty operation", live, rpctypes.ErrGRPCKeyNotFound, leasecore.ErrInvalidArgument},
		{"client send limit", live, status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (3 vs. 2)"), leasecore.ErrInvalidArgument},
		{"context canceled kept", live, fmt.Errorf("x: %w", context.Canceled), context.Canceled},
		{"context deadline kept", live, context.DeadlineExceeded, context.DeadlineExceeded},
		{"gRPC canceled, ctx cancelled", cancelled, status.Error(codes.Canceled, "context canceled"), context.Canceled},
		{"gRPC deadline, ctx expired", expired, status.Error(codes.DeadlineExceeded, "deadline"), context.DeadlineExceeded},
		{"unavailable after ctx ended", cancelled, rpctypes.ErrNoLeader, context.Canceled},
		{"gRPC canceled, ctx live", live, status.Error(codes.Canceled, "grpc: the client connection is closing"), nil},
		{"compacted", live, rpctypes.ErrCompacted, nil},
		{"permission denied", live, rpctypes.ErrPermissionDenied, leasecore.ErrConfig},
		{"gRPC permission denied", live, rpctypes.ErrGRPCPermissionDenied, leasecore.ErrConfig},
		{"authentication failed", live, rpctypes.ErrAuthFailed, leasecore.ErrConfig},
		{"gRPC authentication failed", live, rpctypes.ErrGRPCAuthFailed, leasecore.ErrConfig},
		{"user name empty", live, rpctypes.ErrUserEmpty, leasecore.ErrConfig},
		{"permission denied after ctx ended", cancelled, rpctypes.ErrPermissionDenied, context.Canceled},
		{"other", live, errors.New("boom"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MapError(tc.ctx, "fenceetcd", "acquire", tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not wrap the client's error %v", got, tc.err)
			}
			if !strings.HasPrefix(got.Error(), "fenceetcd: acquire: ") {
				t.Errorf("message %q lacks the prefix", got)
			}
			if tc.want != nil && !errors.Is(got, tc.want) {
				t.Errorf("%v does not wrap %v", got, tc.want)
			}
			for _, s := range []error{leasecore.ErrUnavailable, leasecore.ErrLost, leasecore.ErrInvalidArgument,
				leasecore.ErrConfig, context.Canceled, context.DeadlineExceeded} {
				if s != tc.want && !errors.Is(tc.err, s) && errors.Is(got, s) {
					t.Errorf("%v wraps %v too", got, s)
				}
			}
		})
	}
	if MapError(live, "fenceetcd", "acquire", nil) != nil {
		t.Error("MapError(nil) != nil")
	}
}

// A context that ended with a cause of its own (a session's, at its local
// deadline) gives its cause to the mapped error as well as its error.
func TestMapErrorKeepsTheContextsCause(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("session: %w", leasecore.ErrLocalDeadline))
	for _, err := range []error{context.Canceled, status.Error(codes.Canceled, "context canceled"), rpctypes.ErrNoLeader} {
		got := MapError(ctx, "fenceetcd", "commit", err)
		if !errors.Is(got, context.Canceled) || !errors.Is(got, leasecore.ErrLocalDeadline) || !errors.Is(got, err) {
			t.Errorf("MapError(%v) = %v, want it to wrap context.Canceled, the cause ErrLocalDeadline and the client's error", err, got)
		}
	}
	plain, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if got := MapError(plain, "fenceetcd", "commit", context.Canceled); got.Error() != "fenceetcd: commit: context canceled" {
		t.Errorf("without a cause of its own: %q, want nothing added", got)
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	w := leasecore.Write{Scope: "s", Part: "p", Content: "a\x01\"<>\u2028日报", Writer: "holder-a", Token: 7}
	p, err := DecodePart("k", []byte(NewPartRecord(w).Encode()))
	if err != nil {
		t.Fatal(err)
	}
	sp := p.StoredPart("s", "p")
	if sp.Content != w.Content || sp.Writer != w.Writer || sp.Token != 7 || sp.WrittenAt.IsZero() {
		t.Fatalf("part round trip: %+v", sp)
	}
	a, err := DecodeAttempt("k", []byte(NewAttemptRecord(w, false, 0).Encode()))
	if err != nil || a.Part != "p" || a.Writer != "holder-a" || a.Token != 7 || a.Accepted || a.Floor != 0 || a.At.IsZero() {
		t.Fatalf("attempt round trip: %+v, %v", a, err)
	}
	if s := NewAttemptRecord(w, false, 0).Encode(); strings.Contains(s, "floor") {
		t.Fatalf("a record with an unknown floor names one: %s", s)
	}
	at := time.Now()
	b := leasecore.Batch{Scope: "s", Writer: "holder-a", Token: 9,
		Parts: []leasecore.PartContent{{Part: "summary"}, {Part: "detail"}}}
	enc := NewBatchAttemptRecord(b, true, 9, at).Encode()
	ba, err := DecodeAttempt("k", []byte(enc))
	if err != nil || ba.Part != "" || strings.Join(ba.PartNames(), ",") != "summary,detail" || !ba.Accepted ||
		ba.Floor != 9 || ba.Token != 9 || !ba.At.Equal(at) || strings.Contains(enc, `"part"`) {
		t.Fatalf("batch attempt round trip: %s -> %+v, %v", enc, ba, err)
	}
	if got := strings.Join(a.PartNames(), ","); got != "p" {
		t.Fatalf("single attempt's parts: %q", got)
	}
	for _, bad := range []string{`{"part":"p","parts":["q"],"writer":"w","token":1}`, `"x"`} {
		if _, err := DecodeAttempt("k", []byte(bad)); err == nil {
			t.Errorf("DecodeAttempt(%s): no error", bad)
		}
	}
	// A check of the fence alone names no part: one attempt with Part "".
	c := leasecore.Claim{Scope: "s", Writer: "holder-a", Token: 4}
	enc = NewClaimAttemptRecord(c, false, 6, at).Encode()
	ca, err := DecodeAttempt("k", []byte(enc))
	if err != nil || len(ca.PartNames()) != 1 || ca.PartNames()[0] != "" || ca.Accepted || ca.Floor != 6 ||
		ca.Token != 4 || strings.Contains(enc, "part") {
		t.Fatalf("claim attempt round trip: %s -> %+v, %v", enc, ca, err)
	}
	if _, err := DecodePart("k", []byte("00000000000000000005")); err == nil || !strings.Contains(err.Error(), `"k"`) {
		t.Fatalf("decoding a non-record: %v", err)
	}
	// The worst content for a JSON string stays within 4/3 as base64.
	big := leasecore.Write{Content: strings.Repeat("\x01", backendkit.MaxContentLen), Writer: "w", Token: 1}
	if n := len(NewPartRecord(big).Encode()); n > backendkit.MaxContentLen*4/3+200 {
		t.Fatalf("record of MaxContentLen control characters is %d bytes", n)
	}
}

// TestPartRecordEncoding: PartRecord.Encode writes the bytes encoding/json
// writes for the record, on its hand-written path and on the fallback
// (writers JSON escapes, other zones, empty and nil content, odd years),
// and EncodeToken agrees with its zero-padded decimal definition.
func TestPartRecordEncoding(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)
	r := rand.New(rand.NewPCG(3, 4))
	binary := make([]byte, 3*256*2+2) // more than one piece of the base64 loop, not a multiple of 3
	for i := range binary {
		binary[i] = byte(r.UintN(256))
	}
	records := []PartRecord{
		{Content: []byte("rows=100"), Writer: "holder-a", Token: 1, WrittenAt: at},
		{Content: []byte{}, Writer: "w", Token: math.MaxUint64, WrittenAt: at},
		{Content: nil, Writer: "w", Token: 7, WrittenAt: at},
		{Content: binary, Writer: "a b~!", Token: 123456789, WrittenAt: at.Truncate(time.Second)},
		{Content: []byte("x"), Writer: `q"uote\back<tag>&amp;`, Token: 2, WrittenAt: at},
		{Content: []byte("x"), Writer: "tab\there", Token: 2, WrittenAt: at},
		{Content: []byte("x"), Writer: "ünïcode\u2028", Token: 2, WrittenAt: at},
		{Content: []byte("x"), Writer: "zone", Token: 2, WrittenAt: at.In(time.FixedZone("x", 3600))},
		{Content: []byte("x"), Writer: "local", Token: 2, WrittenAt: time.Now()},
		{Content: []byte("x"), Writer: "year", Token: 2, WrittenAt: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Content: []byte("x"), Writer: "zero", Token: 0},
	}
	for _, p := range records {
		want, err := json.Marshal(p)
		if err != nil {
			want = nil // mustJSON panics; Encode must too
		}
		got := func() (s string, panicked bool) {
			defer func() { panicked = recover() != nil }()
			return p.Encode(), false
		}
		s, panicked := got()
		if want == nil {
			if !panicked {
				t.Errorf("Encode(%+v) = %s; encoding/json fails on it", p, s)
			}
			continue
		}
		if s != string(want) {
			t.Errorf("Encode(%+v)\n got %s\nwant %s", p, s, want)
		}
		if p.Content == nil || p.WrittenAt.Location() != time.UTC {
			continue // not a record NewPartRecordAt makes
		}
		w := leasecore.Write{Content: string(p.Content), Writer: p.Writer, Token: leasecore.Token(p.Token)}
		if s := EncodePartRecord(w, p.WrittenAt); s != string(want) {
			t.Errorf("EncodePartRecord(%+v)\n got %s\nwant %s", p, s, want)
		}
	}
	for n := range 10 { // every length modulo 3, around a piece's end
		w := leasecore.Write{Content: string(binary[:3*256-4+n]), Writer: "w", Token: 5}
		want, _ := json.Marshal(NewPartRecordAt(w, at))
		if s := EncodePartRecord(w, at); s != string(want) {
			t.Errorf("EncodePartRecord of %d bytes\n got %s\nwant %s", len(w.Content), s, want)
		}
	}
	for _, tok := range []leasecore.Token{0, 1, 9, 10, 12345, backendkit.MaxToken, math.MaxUint64} {
		if got, want := EncodeToken(tok), fmt.Sprintf("%020d", uint64(tok)); got != want {
			t.Errorf("EncodeToken(%d) = %q, want %q", tok, got, want)
		}
	}
}
