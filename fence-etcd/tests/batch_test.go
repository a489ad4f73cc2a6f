package fenceetcd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// writeBatch writes a batch whose part p has content "<p> by <writer>",
// and fails the test on error.
func writeBatch(t *testing.T, r backendkit.BatchWriter, scope, writer string, token leasecore.Token, parts ...string) leasecore.Result {
	t.Helper()
	b := leasecore.Batch{Scope: scope, Writer: writer, Token: token}
	for _, p := range parts {
		b.Parts = append(b.Parts, leasecore.PartContent{Part: p, Content: p + " by " + writer})
	}
	res, err := r.WriteBatch(context.Background(), b)
	if err != nil {
		t.Fatalf("batch by %s token %d: %v", writer, token, err)
	}
	return res
}

// TestWriteBatch: a batch is compared with the floor once and stores all
// its parts or none; a new scope accepts it; an equal token is accepted
// again; the log has one entry per part (from one attempt key per batch).
func TestWriteBatch(t *testing.T) {
	f := newFixture(t)
	const scope = "daily-report"

	backendtest.WantResult(t, "first batch, new scope", writeBatch(t, f.res, scope, "holder-b", 5, "summary", "detail"), true, 5)
	backendtest.WantPart(t, f.res, scope, "summary", "summary by holder-b", "holder-b", 5)
	backendtest.WantPart(t, f.res, scope, "detail", "detail by holder-b", "holder-b", 5)
	backendtest.WantFloor(t, f.res, scope, 5)

	// All or none: a stale batch stores no part, not even a new one.
	snap := f.snapshot(t)
	backendtest.WantResult(t, "stale batch", writeBatch(t, f.res, scope, "holder-a", 3, "summary", "extra"), false, 5)
	backendtest.WantPart(t, f.res, scope, "summary", "summary by holder-b", "holder-b", 5)
	backendtest.WantPart(t, f.res, scope, "extra", "", "", 0)
	if got := f.snapshot(t); strings.Count(got, "/attempt/") != strings.Count(snap, "/attempt/")+1 ||
		stripAttempts(got) != stripAttempts(snap) {
		t.Fatalf("a rejected batch changed more than one attempt key:\n%s\n->\n%s", snap, got)
	}

	backendtest.WantResult(t, "equal token again", writeBatch(t, f.res, scope, "holder-b", 5, "detail"), true, 5)
	backendtest.WantResult(t, "single write below the batch's token", backendtest.Write(t, f.res, scope, "summary", "late", "holder-a", 4), false, 5)
	backendtest.WantResult(t, "larger token", writeBatch(t, f.res, scope, "holder-c", 9, "summary", "detail", "extra"), true, 9)
	for _, p := range []string{"summary", "detail", "extra"} {
		backendtest.WantPart(t, f.res, scope, p, p+" by holder-c", "holder-c", 9)
	}
	want := "summary/holder-b/5/true/5 detail/holder-b/5/true/5 " +
		"summary/holder-a/3/false/5 extra/holder-a/3/false/5 " +
		"detail/holder-b/5/true/5 summary/holder-a/4/false/5 " +
		"summary/holder-c/9/true/9 detail/holder-c/9/true/9 extra/holder-c/9/true/9"
	if got := attemptsString(t, f.res, scope); got != want {
		t.Fatalf("attempts:\n got %s\nwant %s", got, want)
	}
	// Parts of one batch share the attempt's time.
	as, err := f.res.Attempts(context.Background(), scope)
	if err != nil {
		t.Fatal(err)
	}
	if !as[0].At.Equal(as[1].At) || !as[6].At.Equal(as[8].At) {
		t.Errorf("a batch's attempts have different times: %v", as)
	}
	// Five attempts (four batches, one write): five attempt keys.
	if n := strings.Count(f.snapshot(t), f.prefix+"/attempt/"); n != 5 {
		t.Errorf("%d attempt keys, want 5 (one per batch or write)", n)
	}
}

// TestWriteBatchKeyLayout: a batch's attempt key holds one record listing
// its parts; its part keys hold records like Write's.
func TestWriteBatchKeyLayout(t *testing.T) {
	f := newFixture(t)
	writeBatch(t, f.res, "daily/report", "holder-a", 42, "sum mary", "detail")
	resp, err := f.cli.Get(context.Background(), f.prefix+"/attempt/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("attempt keys: %+v, %v", resp, err)
	}
	var attempt map[string]any
	if err := json.Unmarshal(resp.Kvs[0].Value, &attempt); err != nil {
		t.Fatal(err)
	}
	parts, _ := attempt["parts"].([]any)
	if _, single := attempt["part"]; single || len(parts) != 2 || parts[0] != "sum mary" || parts[1] != "detail" ||
		attempt["writer"] != "holder-a" || attempt["token"] != 42.0 || attempt["accepted"] != true ||
		attempt["floor"] != 42.0 || attempt["at"] == nil {
		t.Fatalf("batch attempt record %s", resp.Kvs[0].Value)
	}
	value, _, ok := f.get(t, f.layout(t).Part("daily/report", "sum mary"))
	var part map[string]any
	if !ok || json.Unmarshal([]byte(value), &part) != nil || part["content"] != "c3VtIG1hcnkgYnkgaG9sZGVyLWE=" ||
		part["writer"] != "holder-a" || part["token"] != 42.0 {
		t.Fatalf("part record %s", value)
	}
}

// TestWriteBatchLimits: 64 parts of 16 KiB (backendkit.MaxContentLen in all)
// fit one etcd request; a valid batch that does not fit — maximal content
// with the longest names, every character escaped — is refused by etcd
// with ErrInvalidArgument, at once, and writes nothing.
func TestWriteBatchLimits(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const partLen = backendkit.MaxContentLen / backendkit.MaxBatchParts // 16 KiB
	content := strings.Repeat("\x01", partLen)

	b := leasecore.Batch{Scope: "big", Writer: "holder-a", Token: 7}
	for i := range backendkit.MaxBatchParts {
		b.Parts = append(b.Parts, leasecore.PartContent{Part: fmt.Sprintf("part-%02d", i), Content: content})
	}
	res, err := f.res.WriteBatch(ctx, b)
	if err != nil {
		t.Fatalf("64 parts of 16 KiB: %v", err)
	}
	backendtest.WantResult(t, "64 parts of 16 KiB", res, true, 7)
	for _, i := range []int{0, 31, 63} {
		backendtest.WantPart(t, f.res, "big", fmt.Sprintf("part-%02d", i), content, "holder-a", 7)
	}
	if as, err := f.res.Attempts(ctx, "big"); err != nil || len(as) != backendkit.MaxBatchParts {
		t.Fatalf("attempts of the 64-part batch: %d, %v", len(as), err)
	}

	// Names of 200 bytes, each byte escaped as %3C in keys and as \u003c
	// in JSON: about 1.7 MB in all, above etcd's 1.5 MiB, below the
	// client's 2 MiB send limit, so the server refuses it.
	long := func(prefix string) string { return prefix + strings.Repeat("<", backendkit.MaxNameLen-len(prefix)) }
	huge := leasecore.Batch{Scope: long("s"), Writer: long("w"), Token: 7}
	for i := range backendkit.MaxBatchParts {
		huge.Parts = append(huge.Parts, leasecore.PartContent{Part: long(fmt.Sprintf("%02d", i)), Content: content})
	}
	if err := backendkit.CheckBatch(ctx, huge); err != nil {
		t.Fatalf("the oversized batch is not valid input: %v", err)
	}
	snap := f.snapshot(t)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = f.res.WriteBatch(dctx, huge)
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), "fenceetcd: write batch: ") ||
		dctx.Err() != nil {
		t.Fatalf("oversized batch: got %v, want ErrInvalidArgument from etcd's request limit", err)
	}
	t.Logf("oversized batch: %v", err)
	if got := f.snapshot(t); got != snap {
		t.Fatalf("a refused batch changed the keys:\n%s\n->\n%s", snap, got)
	}
}

// TestConcurrentBatches: two writers, each on its own connection, write the
// same two parts of a scope at once, many times over: the parts always come
// from one batch, the larger token's (I3, all or none).
func TestConcurrentBatches(t *testing.T) {
	f := newFixture(t)
	var res [2]*fenceetcd.Resource
	for i := range res {
		var err error
		if res[i], err = fenceetcd.NewResource(etcdtest.Client(t), fenceetcd.WithPrefix(f.prefix), logAll); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 20 {
		scope := fmt.Sprintf("race-%d", round)
		tokens := [2]leasecore.Token{10, 20}
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
				w := fmt.Sprintf("w%d", i)
				results[i], errs[i] = res[i].WriteBatch(context.Background(), leasecore.Batch{Scope: scope, Writer: w, Token: tokens[i],
					Parts: []leasecore.PartContent{{Part: "summary", Content: "s by " + w}, {Part: "detail", Content: "d by " + w}}})
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
		if !results[hi].Accepted {
			t.Fatalf("round %d: the larger token's batch was rejected: %+v", round, results)
		}
		w := fmt.Sprintf("w%d", hi)
		backendtest.WantPart(t, f.res, scope, "summary", "s by "+w, w, tokens[hi])
		backendtest.WantPart(t, f.res, scope, "detail", "d by "+w, w, tokens[hi])
		backendtest.WantFloor(t, f.res, scope, tokens[hi])
		if as, err := f.res.Attempts(context.Background(), scope); err != nil || len(as) != 4 ||
			as[0].Accepted != as[1].Accepted || as[2].Accepted != as[3].Accepted {
			t.Fatalf("round %d: attempts %+v, %v", round, as, err)
		}
	}
}
