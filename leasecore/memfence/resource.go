package memfence

import (
	"context"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Resource is an in-memory fenced resource with a scope-level floor and a
// write log. The zero value is not usable; call NewResource.
type Resource struct {
	mu     sync.Mutex
	floors map[string]leasecore.Token
	parts  map[[2]string]leasecore.StoredPart
	log    []leasecore.Attempt
}

// NewResource returns an empty resource.
func NewResource() *Resource {
	return &Resource{floors: map[string]leasecore.Token{}, parts: map[[2]string]leasecore.StoredPart{}}
}

var (
	_ leasecore.FencedResource  = (*Resource)(nil)
	_ backendkit.BatchWriter    = (*Resource)(nil)
	_ backendkit.ResourceReader = (*Resource)(nil)
)

// Write implements leasecore.FencedResource.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	return r.write(w, []leasecore.PartContent{{Part: w.Part, Content: w.Content}})
}

// WriteBatch implements backendkit.BatchWriter: one floor comparison, all
// parts stored or none.
func (r *Resource) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	if err := backendkit.CheckBatch(ctx, b); err != nil {
		return leasecore.Result{}, err
	}
	w := leasecore.Write{Scope: b.Scope, Part: b.Parts[0].Part, Content: b.Parts[0].Content, Writer: b.Writer, Token: b.Token}
	return r.write(w, b.Parts)
}

// write compares w's token with the floor and applies parts under one
// lock; w names the scope, writer and token (and is what the gap sees).
func (r *Resource) write(w leasecore.Write, parts []leasecore.PartContent) (leasecore.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()

	// Compare and decide under the same lock that applies the write: that
	// is what makes the check and the write one atomic step.
	floor := r.floors[w.Scope]
	accepted := w.Token >= floor
	if accepted {
		floor = w.Token
	}
	now := time.Now()
	if accepted {
		r.floors[w.Scope] = floor
	}
	for _, p := range parts {
		if accepted {
			r.parts[[2]string{w.Scope, p.Part}] = leasecore.StoredPart{
				Scope: w.Scope, Part: p.Part, Content: p.Content, Writer: w.Writer, Token: w.Token, WrittenAt: now,
			}
		}
		r.log = append(r.log, leasecore.Attempt{
			Scope: w.Scope, Part: p.Part, Writer: w.Writer, Token: w.Token, Accepted: accepted, Floor: floor, At: now,
		})
	}
	return leasecore.Result{Accepted: accepted, Floor: floor}, nil
}

// Floor implements backendkit.ResourceReader.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	if err := checkRead(ctx, scope); err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.floors[scope], nil
}

// ReadPart implements backendkit.ResourceReader.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	if err := checkRead(ctx, scope); err != nil {
		return leasecore.StoredPart{}, false, err
	}
	if err := backendkit.CheckName("read part", "part", part); err != nil {
		return leasecore.StoredPart{}, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.parts[[2]string{scope, part}]
	return p, ok, nil
}

// Attempts implements backendkit.ResourceReader.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	if err := checkRead(ctx, scope); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []leasecore.Attempt
	for _, a := range r.log {
		if a.Scope == scope {
			out = append(out, a)
		}
	}
	return out, nil
}

func checkRead(ctx context.Context, scope string) error {
	if err := backendkit.CheckName("read", "scope", scope); err != nil {
		return err
	}
	return backendkit.CheckContext("read", ctx)
}
