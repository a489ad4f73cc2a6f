package fenceetcd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// attemptsString renders a scope's write log compactly:
// "part/writer/token/accepted/floor" per attempt.
func attemptsString(t *testing.T, r backendkit.ResourceReader, scope string) string {
	t.Helper()
	as, err := r.Attempts(context.Background(), scope)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		if a.Scope != scope || a.At.IsZero() {
			t.Fatalf("attempt %+v: wrong scope or no time", a)
		}
		out = append(out, fmt.Sprintf("%s/%s/%d/%v/%d", a.Part, a.Writer, a.Token, a.Accepted, a.Floor))
	}
	return strings.Join(out, " ")
}

// TestWriteFence: a new scope accepts any token; an equal token is
// accepted again; a lower token is rejected on every part, the one the
// newer writer never touched included; every attempt is logged with the
// floor after it.
func TestWriteFence(t *testing.T) {
	f := newFixture(t)
	const scope = "daily-report"

	backendtest.WantFloor(t, f.res, scope, 0)
	backendtest.WantPart(t, f.res, scope, "summary", "", "", 0)
	backendtest.WantResult(t, "first write of a new scope", backendtest.Write(t, f.res, scope, "summary", "rows=1(A)", "holder-a", 5), true, 5)
	backendtest.WantResult(t, "equal token again", backendtest.Write(t, f.res, scope, "summary", "rows=2(A)", "holder-a", 5), true, 5)
	backendtest.WantPart(t, f.res, scope, "summary", "rows=2(A)", "holder-a", 5)
	backendtest.WantResult(t, "larger token, other part", backendtest.Write(t, f.res, scope, "detail", "d(B)", "holder-b", 9), true, 9)
	backendtest.WantFloor(t, f.res, scope, 9)

	snap := f.snapshot(t)
	backendtest.WantResult(t, "lower token, the part it wrote", backendtest.Write(t, f.res, scope, "summary", "rows=3(A)", "holder-a", 5), false, 9)
	backendtest.WantResult(t, "lower token, a part nobody wrote", backendtest.Write(t, f.res, scope, "extra", "x(A)", "holder-a", 8), false, 9)
	backendtest.WantPart(t, f.res, scope, "summary", "rows=2(A)", "holder-a", 5)
	backendtest.WantPart(t, f.res, scope, "extra", "", "", 0)
	backendtest.WantFloor(t, f.res, scope, 9)
	// A rejection changes nothing but the log.
	if got := f.snapshot(t); strings.Count(got, "/attempt/") != strings.Count(snap, "/attempt/")+2 ||
		stripAttempts(got) != stripAttempts(snap) {
		t.Fatalf("rejections changed more than the log:\n%s\n->\n%s", snap, got)
	}

	backendtest.WantResult(t, "larger token again", backendtest.Write(t, f.res, scope, "summary", "rows=4(C)", "holder-c", 12), true, 12)
	want := "summary/holder-a/5/true/5 summary/holder-a/5/true/5 detail/holder-b/9/true/9 " +
		"summary/holder-a/5/false/9 extra/holder-a/8/false/9 summary/holder-c/12/true/12"
	if got := attemptsString(t, f.res, scope); got != want {
		t.Fatalf("attempts:\n got %s\nwant %s", got, want)
	}

	// Scopes are independent, also when one's name is a prefix of the
	// other's.
	backendtest.WantResult(t, "another scope", backendtest.Write(t, f.res, scope+"/2", "summary", "s2", "holder-a", 1), true, 1)
	backendtest.WantFloor(t, f.res, scope, 12)
	if got := attemptsString(t, f.res, scope+"/2"); got != "summary/holder-a/1/true/1" {
		t.Fatalf("attempts of the other scope: %s", got)
	}
}

var attemptLine = regexp.MustCompile(`(?m)^\S+/attempt/.*\n`)

func stripAttempts(snap string) string {
	snap = attemptLine.ReplaceAllString(snap, "")
	_, rest, _ := strings.Cut(snap, "\n") // the key count
	return rest
}

// TestKeyLayout: the keys and values a write leaves, as documented.
func TestKeyLayout(t *testing.T) {
	f := newFixture(t)
	backendtest.Write(t, f.res, "daily/report", "sum mary", "c", "holder-a", 42)
	resp, err := f.cli.Get(context.Background(), f.prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		k := strings.TrimPrefix(string(kv.Key), f.prefix)
		if strings.HasPrefix(k, "/attempt/") {
			if !regexp.MustCompile(`^/attempt/daily%2Freport/[0-9]{20}-[0-9a-f]{8}$`).MatchString(k) {
				t.Errorf("attempt key %q", k)
			}
			k = "/attempt/daily%2Freport/*"
		}
		got[k] = string(kv.Value)
	}
	if len(got) != 3 || got["/floor/daily%2Freport"] != "00000000000000000042" {
		t.Fatalf("keys: %q", got)
	}
	var part map[string]any
	if err := json.Unmarshal([]byte(got["/part/daily%2Freport/sum%20mary"]), &part); err != nil ||
		part["content"] != "Yw==" || part["writer"] != "holder-a" || part["token"] != 42.0 || part["written_at"] == nil {
		t.Fatalf("part record %s: %v", got["/part/daily%2Freport/sum%20mary"], err)
	}
	var attempt map[string]any
	if err := json.Unmarshal([]byte(got["/attempt/daily%2Freport/*"]), &attempt); err != nil ||
		attempt["part"] != "sum mary" || attempt["writer"] != "holder-a" || attempt["token"] != 42.0 ||
		attempt["accepted"] != true || attempt["floor"] != 42.0 || attempt["at"] == nil {
		t.Fatalf("attempt record %s: %v", got["/attempt/daily%2Freport/*"], err)
	}
}

// TestConcurrentFirstWrites: two writers, each on its own connection,
// write the same new scope at once, many times over. Whatever the order,
// the larger token ends as the floor and its content stays; a smaller
// token is accepted only when it came first (I3).
func TestConcurrentFirstWrites(t *testing.T) {
	f := newFixture(t)
	var res [2]*fenceetcd.Resource
	for i := range res {
		var err error
		if res[i], err = fenceetcd.NewResource(etcdtest.Client(t), fenceetcd.WithPrefix(f.prefix), logAll); err != nil {
			t.Fatal(err)
		}
	}
	lowFirst := 0
	for round := range 40 {
		scope := fmt.Sprintf("race-%d", round)
		tokens := [2]leasecore.Token{10, 20}
		if round%4 == 1 {
			tokens[1] = 10 // equal tokens: both accepted
		}
		if round%2 == 1 {
			tokens[0], tokens[1] = tokens[1], tokens[0]
		}
		var results [2]leasecore.Result
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 {
			wg.Go(func() {
				<-start
				results[i], errs[i] = res[i].Write(context.Background(), leasecore.Write{Scope: scope, Part: "summary",
					Content: fmt.Sprintf("by %d", i), Writer: fmt.Sprintf("w%d", i), Token: tokens[i]})
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		hi := 0
		if tokens[1] > tokens[0] {
			hi = 1
		}
		lo := 1 - hi
		if !results[hi].Accepted || results[hi].Floor != tokens[hi] {
			t.Fatalf("round %d: the larger token %d got %+v", round, tokens[hi], results[hi])
		}
		backendtest.WantFloor(t, f.res, scope, tokens[hi])
		as, err := f.res.Attempts(context.Background(), scope)
		if err != nil || len(as) != 2 {
			t.Fatalf("round %d: attempts %+v, %v", round, as, err)
		}
		if tokens[lo] == tokens[hi] {
			if !results[lo].Accepted {
				t.Fatalf("round %d: equal token rejected: %+v", round, results)
			}
			continue
		}
		// The smaller token is accepted only when it was applied before
		// the larger one advanced the floor; the log says the same (a
		// rejection's record is stored after it is known, so the log's
		// order is not the order of the decisions).
		var lowLogged leasecore.Attempt
		for _, a := range as {
			if a.Token == tokens[lo] {
				lowLogged = a
			}
		}
		if results[lo].Accepted {
			lowFirst++
			if !lowLogged.Accepted || lowLogged.Floor != tokens[lo] || results[lo].Floor != tokens[lo] {
				t.Fatalf("round %d: the smaller token was accepted: %+v, logged %+v", round, results, as)
			}
		} else if lowLogged.Accepted || results[lo].Floor != tokens[hi] || lowLogged.Floor != tokens[hi] {
			t.Fatalf("round %d: the smaller token was rejected: %+v, logged %+v", round, results, as)
		}
		backendtest.WantPart(t, f.res, scope, "summary", fmt.Sprintf("by %d", hi), fmt.Sprintf("w%d", hi), tokens[hi])
	}
	t.Logf("the smaller token was accepted (applied first) in %d of 30 rounds with different tokens", lowFirst)
}

// TestMaxContent: a write of backendkit.MaxContentLen bytes fits one etcd
// request, whatever the content (JSON would escape these characters to as
// much as six bytes each).
func TestMaxContent(t *testing.T) {
	f := newFixture(t)
	for i, c := range []string{"\x01", `"`, "\u2028"} {
		content := strings.Repeat(c, backendkit.MaxContentLen/len(c))
		scope := fmt.Sprintf("big-%d", i)
		backendtest.WantResult(t, fmt.Sprintf("%q x %d", c, len(content)/len(c)), backendtest.Write(t, f.res, scope, "summary", content, "holder-a", 1), true, 1)
		backendtest.WantPart(t, f.res, scope, "summary", content, "holder-a", 1)
	}
}
