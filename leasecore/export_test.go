package leasecore

// The optional interfaces leasecore looks for on a Lease, under names the
// external tests can use: optional_test.go checks that they are the ones
// backendkit documents for backends.
type (
	InternalWaiter        = freeWaiter
	InternalBatchRenewer  = batchRenewer
	InternalBatchAcquirer = batchAcquirer
)
