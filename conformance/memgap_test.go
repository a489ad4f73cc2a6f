package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// The in-memory harness's commit gap and lock-wait probe (F6b). memfence
// itself has no test hooks: the harness puts its part store behind a write
// lock of its own, the in-memory counterpart of the floor row lock a
// PostgreSQL write holds until COMMIT. A gapped write runs its gap with
// the lock held, so every other write of the resource queues behind it,
// and the queue is what LockWaits reports.

// memWriteLock is the write lock all part-store clients of one harness
// share.
type memWriteLock struct {
	mu      sync.Mutex
	waiting atomic.Int64 // writes blocked on mu
}

// memPartStore is the part store the in-memory harness gives the suite.
type memPartStore struct {
	*memfence.Resource
	lock *memWriteLock
	gap  conformance.Gap // nil: no pause
}

// locked runs write under the lock, after the gap.
func (r memPartStore) locked(ctx context.Context, w leasecore.Write, write func() (leasecore.Result, error)) (leasecore.Result, error) {
	r.lock.waiting.Add(1)
	r.lock.mu.Lock()
	r.lock.waiting.Add(-1)
	defer r.lock.mu.Unlock()
	if r.gap != nil {
		if err := r.gap(ctx, w); err != nil {
			return leasecore.Result{}, err // abandoned: nothing applied
		}
	}
	return write()
}

func (r memPartStore) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	return r.locked(ctx, w, func() (leasecore.Result, error) { return r.Resource.Write(ctx, w) })
}

func (r memPartStore) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	var w leasecore.Write
	if len(b.Parts) > 0 {
		w = leasecore.Write{Scope: b.Scope, Part: b.Parts[0].Part, Content: b.Parts[0].Content, Writer: b.Writer, Token: b.Token}
	}
	return r.locked(ctx, w, func() (leasecore.Result, error) { return r.Resource.WriteBatch(ctx, b) })
}

// TestMemCommitGapQueuesWriters: the first writer pauses in the gap; the
// second writer of the scope waits (LockWaits sees it), then is judged
// against the floor the first left.
func TestMemCommitGapQueuesWriters(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		first, second leasecore.Write
		secondOK      bool
	}{
		{"older first", leasecore.Write{Scope: "s", Part: "summary", Content: "old", Writer: "holder-a", Token: 1},
			leasecore.Write{Scope: "s", Part: "summary", Content: "new", Writer: "holder-b", Token: 2}, true},
		{"newer first", leasecore.Write{Scope: "s", Part: "summary", Content: "new", Writer: "holder-b", Token: 2},
			leasecore.Write{Scope: "s", Part: "detail", Content: "old", Writer: "holder-a", Token: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nh, _ := newMemHarness(ctx)
			h := nh.(*memHarness)
			paused, release := make(chan struct{}), make(chan struct{})
			r, _ := h.FencedResourceWithGap(ctx, func(_ context.Context, w leasecore.Write) error {
				if w.Writer == tc.first.Writer {
					close(paused)
					<-release
				}
				return nil
			})
			firstDone, secondDone := make(chan leasecore.Result, 1), make(chan leasecore.Result, 1)
			go func() { res, _ := r.Write(ctx, tc.first); firstDone <- res }()
			<-paused
			go func() { res, _ := r.Write(ctx, tc.second); secondDone <- res }()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if w, _ := h.LockWaits(ctx); len(w) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the second write never waited")
				}
			}
			select {
			case res := <-secondDone:
				t.Fatalf("second write finished (%+v) while the first was paused", res)
			default:
			}
			close(release)
			if res := <-firstDone; !res.Accepted {
				t.Errorf("first write = %+v, want accepted", res)
			}
			if res := <-secondDone; res.Accepted != tc.secondOK || res.Floor != 2 {
				t.Errorf("second write = %+v, want accepted=%t floor=2", res, tc.secondOK)
			}
			if w, _ := h.LockWaits(ctx); len(w) != 0 {
				t.Errorf("LockWaits = %v after both writes", w)
			}
			if p, _, _ := r.ReadPart(ctx, "s", "summary"); p.Content != "new" {
				t.Errorf("summary = %q, want new", p.Content)
			}
		})
	}
}

// A write abandoned in the gap applies nothing and leaves nothing locked.
func TestMemCommitGapErrorAppliesNothing(t *testing.T) {
	ctx := context.Background()
	nh, _ := newMemHarness(ctx)
	h := nh.(*memHarness)
	errAbort := errors.New("test: connection lost before commit")
	r, _ := h.FencedResourceWithGap(ctx, func(_ context.Context, w leasecore.Write) error {
		if w.Writer == "holder-b" {
			return errAbort
		}
		return nil
	})
	if res, err := r.Write(ctx, leasecore.Write{Scope: "s", Part: "summary", Content: "a", Writer: "holder-a", Token: 1}); err != nil || !res.Accepted {
		t.Fatalf("holder-a's write = %+v, %v", res, err)
	}
	if res, err := r.Write(ctx, leasecore.Write{Scope: "s", Part: "summary", Content: "b", Writer: "holder-b", Token: 2}); !errors.Is(err, errAbort) {
		t.Fatalf("write through a failing gap = %+v, %v; want the gap's error", res, err)
	}
	f, _ := r.Floor(ctx, "s")
	p, _, _ := r.ReadPart(ctx, "s", "summary")
	as, _ := r.Attempts(ctx, "s")
	if got := fmt.Sprintf("floor=%d summary=%s attempts=%d", f, p.Content, len(as)); got != "floor=1 summary=a attempts=1" {
		t.Errorf("after the abandoned write: %s, want floor=1 summary=a attempts=1", got)
	}
	if res, err := r.Write(ctx, leasecore.Write{Scope: "s", Part: "detail", Content: "a", Writer: "holder-a", Token: 1}); err != nil || !res.Accepted {
		t.Errorf("the resource stayed locked: %+v, %v", res, err)
	}
}
