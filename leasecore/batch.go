package leasecore

import (
	"context"
	"time"
)

// PartContent is one part of a Batch.
type PartContent struct {
	Part    string
	Content string
}

// Batch is several parts of one scope written under one token, all or none:
// the daily report's summary and detail together. A batch holds 1 to
// backendkit.MaxBatchParts parts, with at most backendkit.MaxContentLen
// bytes of content in all (backendkit.CheckBatch).
type Batch struct {
	Scope  string
	Writer string
	Token  Token
	Space  string // the token's space (Grant.Space); optional, see Claim.Space
	Parts  []PartContent
}

// batchRenewer is backendkit.BatchRenewer, which documents it for
// backends: NewSessionSet requires it of its lease.
type batchRenewer interface {
	RenewAll(ctx context.Context, gs []Grant) (renewed []Grant, lost []error, err error)
}

// batchAcquirer is backendkit.BatchAcquirer, which documents it for
// backends: SessionSet.AcquireAll uses it when its lease has it.
type batchAcquirer interface {
	AcquireAll(ctx context.Context, names []string, holder string, ttl time.Duration) (grants []Grant, errs []error, err error)
}
