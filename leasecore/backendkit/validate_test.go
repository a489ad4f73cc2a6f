package backendkit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

func TestCheckName(t *testing.T) {
	tests := []struct {
		name   string
		v      string
		ok     bool
		reason string // a substring of the reason, when rejected
	}{
		{"empty", "", false, "empty"},
		{"space only", " ", false, "whitespace"},
		{"whitespace only", " \t \n", false, "whitespace"},
		{"leading space", " holder-a", false, "begin or end"},
		{"trailing space", "holder-a ", false, "begin or end"},
		{"leading tab", "\tholder-a", false, "begin or end"},
		{"trailing newline", "holder-a\n", false, "begin or end"},
		{"trailing no-break space", "holder-a\u00a0", false, "begin or end"},
		{"exactly MaxNameLen", strings.Repeat("a", backendkit.MaxNameLen), true, ""},
		{"exactly MaxNameLen multibyte", strings.Repeat("é", backendkit.MaxNameLen/2), true, ""},
		{"MaxNameLen+1", strings.Repeat("a", backendkit.MaxNameLen+1), false, "longer than"},
		// The limit is in bytes, not runes: 67 three-byte runes are 201 bytes.
		{"over limit in bytes not runes", strings.Repeat("日", backendkit.MaxNameLen/3+1), false, "longer than"},
		{"NUL", "holder\x00a", false, "U+0000"},
		{"NUL only", "\x00", false, "U+0000"},
		{"SOH", "holder\x01a", false, "control"},
		{"inner newline", "holder\na", false, "control"},
		{"inner tab", "holder\ta", false, "control"},
		{"DEL", "holder\x7fa", false, "control"},
		{"C1 control", "holder\u0085a", false, "control"},
		{"invalid UTF-8", "holder\xffa", false, "UTF-8"},
		{"truncated UTF-8", "holder-\xe6\x97", false, "UTF-8"},
		{"simple", "holder-a", true, ""},
		{"single char", "x", true, ""},
		{"inner space", "daily report", true, ""},
		{"SQL-looking", "x'); DROP TABLE lease; --", true, ""},
		{"SQL quote and backslash", `a'b"c\d%_`, true, ""},
		{"unicode", "日报-作业", true, ""},
		{"unicode accents", "holder-ä-ß", true, ""},
		{"emoji", "report-📈", true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := backendkit.CheckName("acquire", "holder", tc.v)
			if tc.ok {
				if err != nil {
					t.Fatalf("CheckName(%q) = %v, want nil", tc.v, err)
				}
				return
			}
			ae := testcheck.WantArgError(t, err, "acquire", "holder")
			if !strings.Contains(ae.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", ae.Reason, tc.reason)
			}
		})
	}
}

func TestCheckNameUsesGivenField(t *testing.T) {
	for _, field := range []string{"name", "holder", "scope", "part", "writer"} {
		testcheck.WantArgError(t, backendkit.CheckName("op-x", field, ""), "op-x", field)
	}
}

// A long or hostile value must not flood the log: the message quotes a
// shortened, escaped form.
func TestArgErrorShortensLongValues(t *testing.T) {
	long := strings.Repeat("x", 10_000)
	err := backendkit.CheckName("acquire", "name", long)
	testcheck.WantArgError(t, err, "acquire", "name")
	msg := err.Error()
	if len(msg) > 200 {
		t.Errorf("message is %d bytes, want it shortened: %q", len(msg), msg)
	}
	if !strings.Contains(msg, `"`+strings.Repeat("x", 40)+`"...`) {
		t.Errorf("message %q does not show the first 40 runes followed by ...", msg)
	}

	// Shortening counts runes, so a multibyte value is not cut mid-rune.
	err = backendkit.CheckName("acquire", "name", strings.Repeat("日", 100))
	if msg := err.Error(); !strings.Contains(msg, `"`+strings.Repeat("日", 40)+`"...`) {
		t.Errorf("message %q does not show the first 40 runes followed by ...", msg)
	}

	// Control characters and invalid bytes are escaped, not printed raw.
	err = backendkit.CheckName("acquire", "name", "a\x00b\xffc")
	if msg := err.Error(); strings.Contains(msg, "\x00") || strings.Contains(msg, "\xff") {
		t.Errorf("message %q contains raw control or invalid bytes", msg)
	}

	content := strings.Repeat("c", backendkit.MaxContentLen+1)
	err = backendkit.CheckContent("write", content)
	testcheck.WantArgError(t, err, "write", "content")
	if len(err.Error()) > 300 {
		t.Errorf("content message is %d bytes, want it shortened", len(err.Error()))
	}
}

// Rejecting an over-sized input must not cost a multiple of its size: the
// message only needs its first runes. (quote once converted the whole value
// to []rune: 1 GiB allocated to reject 256 MiB.)
func TestCheckContentOversizedIsCheap(t *testing.T) {
	big := strings.Repeat("a", 16<<20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := backendkit.CheckContent("write", big)
	runtime.ReadMemStats(&after)
	testcheck.WantArgError(t, err, "write", "content")
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("rejecting 16 MiB of content allocated %d bytes, want under 1 MiB", n)
	}

	// A shortened invalid value keeps its escapes, as an unshortened one does.
	err = backendkit.CheckName("acquire", "name", strings.Repeat("\xff", 50))
	if msg := err.Error(); !strings.Contains(msg, `"`+strings.Repeat(`\xff`, 40)+`"...`) {
		t.Errorf("message %q, want 40 escaped bytes followed by ...", msg)
	}
}

func TestCheckTTL(t *testing.T) {
	const minTTL = time.Millisecond
	tests := []struct {
		name   string
		ttl    time.Duration
		ok     bool
		reason string
	}{
		{"zero", 0, false, "positive"},
		{"negative", -time.Second, false, "positive"},
		{"most negative", time.Duration(math.MinInt64), false, "positive"},
		{"below minimum", minTTL - 1, false, "minimum"},
		{"exactly minimum", minTTL, true, ""},
		{"typical", 1500 * time.Millisecond, true, ""},
		{"exactly MaxTTL", backendkit.MaxTTL, true, ""},
		{"above MaxTTL", backendkit.MaxTTL + time.Nanosecond, false, "maximum"},
		{"MaxInt64", time.Duration(math.MaxInt64), false, "maximum"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := backendkit.CheckTTL("acquire", tc.ttl, minTTL)
			if tc.ok {
				if err != nil {
					t.Fatalf("CheckTTL(%v) = %v, want nil", tc.ttl, err)
				}
				return
			}
			ae := testcheck.WantArgError(t, err, "acquire", "ttl")
			if !strings.Contains(ae.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", ae.Reason, tc.reason)
			}
			if !strings.Contains(err.Error(), tc.ttl.String()) {
				t.Errorf("message %q does not show the value %v", err, tc.ttl)
			}
		})
	}
}

func TestCheckToken(t *testing.T) {
	tests := []struct {
		name string
		tok  leasecore.Token
		ok   bool
	}{
		{"zero", 0, false},
		{"one", 1, true},
		{"MaxToken", backendkit.MaxToken, true},
		{"MaxToken+1", backendkit.MaxToken + 1, false},
		{"SealedFloor", leasecore.SealedFloor, false},
		{"MaxInt64+1", math.MaxInt64 + 1, false},
		{"MaxUint64", math.MaxUint64, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := backendkit.CheckToken("write", tc.tok)
			if tc.ok {
				if err != nil {
					t.Fatalf("CheckToken(%d) = %v, want nil", tc.tok, err)
				}
				return
			}
			testcheck.WantArgError(t, err, "write", "token")
			if !strings.Contains(err.Error(), tc.tok.String()) {
				t.Errorf("message %q does not show the value %d", err, tc.tok)
			}
		})
	}
	if got, want := backendkit.MaxToken.String(), "9223372036854775806"; got != want {
		t.Errorf("MaxToken.String() = %q, want %q", got, want)
	}
	if got, want := leasecore.SealedFloor.String(), "9223372036854775807"; got != want {
		t.Errorf("SealedFloor.String() = %q, want %q", got, want)
	}
}

func TestCheckContent(t *testing.T) {
	tests := []struct {
		name    string
		content string
		ok      bool
		reason  string
	}{
		{"empty", "", true, ""},
		{"text", "summary of 2026-12-02", true, ""},
		{"multiline unicode", "第一行\n第二行\t✓", true, ""},
		{"exactly MaxContentLen", strings.Repeat("a", backendkit.MaxContentLen), true, ""},
		{"over MaxContentLen", strings.Repeat("a", backendkit.MaxContentLen+1), false, "larger than"},
		{"NUL", "a\x00b", false, "NUL"},
		{"invalid UTF-8", "a\xc3(b", false, "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := backendkit.CheckContent("write", tc.content)
			if tc.ok {
				if err != nil {
					t.Fatalf("CheckContent = %v, want nil", err)
				}
				return
			}
			ae := testcheck.WantArgError(t, err, "write", "content")
			if !strings.Contains(ae.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", ae.Reason, tc.reason)
			}
		})
	}
}

func goodWrite() leasecore.Write {
	return leasecore.Write{Scope: "daily-report", Part: "summary", Content: "ok", Writer: "holder-a", Token: 1}
}

func TestCheckWrite(t *testing.T) {
	ctx := context.Background()
	if err := backendkit.CheckWrite(ctx, goodWrite()); err != nil {
		t.Fatalf("CheckWrite(good) = %v, want nil", err)
	}
	tests := []struct {
		field string
		edit  func(*leasecore.Write)
	}{
		{"scope", func(w *leasecore.Write) { w.Scope = "" }},
		{"scope", func(w *leasecore.Write) { w.Scope = " daily-report" }},
		{"part", func(w *leasecore.Write) { w.Part = "" }},
		{"part", func(w *leasecore.Write) { w.Part = "sum\x00mary" }},
		{"writer", func(w *leasecore.Write) { w.Writer = "" }},
		{"writer", func(w *leasecore.Write) { w.Writer = strings.Repeat("w", backendkit.MaxNameLen+1) }},
		{"token", func(w *leasecore.Write) { w.Token = 0 }},
		{"token", func(w *leasecore.Write) { w.Token = backendkit.MaxToken + 1 }},
		{"content", func(w *leasecore.Write) { w.Content = "a\x00" }},
		{"content", func(w *leasecore.Write) { w.Content = "\xff" }},
	}
	for _, tc := range tests {
		w := goodWrite()
		tc.edit(&w)
		testcheck.WantArgError(t, backendkit.CheckWrite(ctx, w), "write", tc.field)
	}

	// Empty content is a valid write (a report can be empty).
	w := goodWrite()
	w.Content = ""
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		t.Errorf("CheckWrite(empty content) = %v, want nil", err)
	}
}

func TestCheckAcquire(t *testing.T) {
	ctx := context.Background()
	const minTTL = time.Millisecond
	if err := backendkit.CheckAcquire(ctx, "report-job", "holder-a", time.Second, minTTL); err != nil {
		t.Fatalf("CheckAcquire(good) = %v, want nil", err)
	}
	testcheck.WantArgError(t, backendkit.CheckAcquire(ctx, "", "holder-a", time.Second, minTTL), "acquire", "name")
	testcheck.WantArgError(t, backendkit.CheckAcquire(ctx, "report-job", "holder-a ", time.Second, minTTL), "acquire", "holder")
	testcheck.WantArgError(t, backendkit.CheckAcquire(ctx, "report-job", "holder-a", 0, minTTL), "acquire", "ttl")
	testcheck.WantArgError(t, backendkit.CheckAcquire(ctx, "report-job", "holder-a", minTTL/2, minTTL), "acquire", "ttl")
}

func TestCheckInspect(t *testing.T) {
	ctx := context.Background()
	if err := backendkit.CheckInspect(ctx, "report-job"); err != nil {
		t.Fatalf("CheckInspect(good) = %v, want nil", err)
	}
	testcheck.WantArgError(t, backendkit.CheckInspect(ctx, ""), "inspect", "name")
	testcheck.WantArgError(t, backendkit.CheckInspect(ctx, "report-job\x00"), "inspect", "name")
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := backendkit.CheckInspect(done, "report-job"); !errors.Is(err, context.Canceled) {
		t.Errorf("CheckInspect(cancelled ctx) = %v, want context.Canceled", err)
	}
}

func goodGrant() leasecore.Grant {
	return leasecore.Grant{Name: "report-job", Holder: "holder-a", Token: 7, TTL: time.Second}
}

func TestCheckGrant(t *testing.T) {
	ctx := context.Background()
	const minTTL = time.Millisecond
	for _, op := range []string{"renew", "release"} {
		if err := backendkit.CheckGrant(ctx, op, goodGrant(), minTTL); err != nil {
			t.Fatalf("CheckGrant(%s, good) = %v, want nil", op, err)
		}
		tests := []struct {
			field string
			edit  func(*leasecore.Grant)
		}{
			{"name", func(g *leasecore.Grant) { g.Name = "" }},
			{"holder", func(g *leasecore.Grant) { g.Holder = "\x00" }},
			{"token", func(g *leasecore.Grant) { g.Token = 0 }},
			{"ttl", func(g *leasecore.Grant) { g.TTL = 0 }},
			{"ttl", func(g *leasecore.Grant) { g.TTL = backendkit.MaxTTL + 1 }},
		}
		for _, tc := range tests {
			g := goodGrant()
			tc.edit(&g)
			err := backendkit.CheckGrant(ctx, op, g, minTTL)
			testcheck.WantArgError(t, err, op, tc.field)
			if !strings.Contains(err.Error(), op) {
				t.Errorf("message %q does not name the operation %q", err, op)
			}
		}
	}
}

func TestChecksRejectDoneContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel2()

	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		checks := map[string]error{
			"CheckContext": backendkit.CheckContext("acquire", c.ctx),
			"CheckAcquire": backendkit.CheckAcquire(c.ctx, "report-job", "holder-a", time.Second, 0),
			"CheckGrant":   backendkit.CheckGrant(c.ctx, "renew", goodGrant(), 0),
			"CheckWrite":   backendkit.CheckWrite(c.ctx, goodWrite()),
		}
		for name, err := range checks {
			if !errors.Is(err, c.want) {
				t.Errorf("%s with a done context = %v, want an error wrapping %v", name, err, c.want)
			}
			if errors.Is(err, leasecore.ErrInvalidArgument) {
				t.Errorf("%s with a done context = %v, must not wrap ErrInvalidArgument", name, err)
			}
			if err != nil && !strings.Contains(err.Error(), "ctx") {
				t.Errorf("%s message %q does not say the context is the cause", name, err)
			}
		}
	}
	if err := backendkit.CheckContext("acquire", context.Background()); err != nil {
		t.Errorf("CheckContext(Background) = %v, want nil", err)
	}

	// A context that ended with a cause of its own (a session's context
	// ends with ErrLocalDeadline or ErrLost): the error wraps both.
	caused, cancel3 := context.WithCancelCause(context.Background())
	cancel3(fmt.Errorf("session ended: %w", leasecore.ErrLost))
	err := backendkit.CheckAcquire(caused, "report-job", "holder-a", time.Second, 0)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, leasecore.ErrLost) {
		t.Errorf("CheckAcquire with a context cancelled with a cause = %v, want an error wrapping context.Canceled and the cause", err)
	}
}

// Bad input is reported before a done context: the caller learns about the
// mistake that does not go away on retry.
func TestCheckArgumentsBeforeContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := goodWrite()
	w.Token = 0
	testcheck.WantArgError(t, backendkit.CheckWrite(ctx, w), "write", "token")
}

// TestCheckNameASCIIFastPath compares CheckName, whose printable-ASCII
// fast path decides most names in one pass, with its rules written out,
// on random short strings drawn mostly from ASCII (spaces, controls and
// DEL at any position included) and some non-ASCII bytes.
func TestCheckNameASCIIFastPath(t *testing.T) {
	rules := func(v string) bool {
		if v == "" || len(v) > backendkit.MaxNameLen || !utf8.ValidString(v) ||
			strings.TrimSpace(v) == "" || strings.TrimSpace(v) != v {
			return false
		}
		for _, r := range v {
			if unicode.IsControl(r) {
				return false
			}
		}
		return true
	}
	alphabet := []byte("ab ~\x00\t\n\x1f\x7f\x80\xc3\xa9-")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		b := make([]byte, rng.IntN(8))
		for i := range b {
			if rng.IntN(4) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[i] = byte(0x20 + rng.IntN(0x60)) // printable ASCII and DEL
			}
		}
		v := string(b)
		if got, want := backendkit.CheckName("op", "name", v) == nil, rules(v); got != want {
			t.Fatalf("CheckName(%q) accepts: %v, the rules say %v", v, got, want)
		}
	}
}
