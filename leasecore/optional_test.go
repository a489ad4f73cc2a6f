package leasecore_test

import (
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The interfaces Campaign, Observe and SessionSet look for on a Lease are,
// method for method, the ones backendkit documents for backends: an
// interface converts to another only when it has all of the other's
// methods, so each pair below compiles only while both declare the same.
var (
	_ backendkit.Waiter               = leasecore.InternalWaiter(nil)
	_ leasecore.InternalWaiter        = backendkit.Waiter(nil)
	_ backendkit.BatchRenewer         = leasecore.InternalBatchRenewer(nil)
	_ leasecore.InternalBatchRenewer  = backendkit.BatchRenewer(nil)
	_ backendkit.BatchAcquirer        = leasecore.InternalBatchAcquirer(nil)
	_ leasecore.InternalBatchAcquirer = backendkit.BatchAcquirer(nil)
)
