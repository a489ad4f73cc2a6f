// Package etcdkv is what fence-etcd's production stores (package
// fenceetcd), its negative controls (etcdcontrol) and its conformance
// harness (etcdconformance) share: the key layout under a prefix, the token
// encoding, the stored records, the resource reader and the one function
// that maps etcd and gRPC errors to leasecore's sentinels. It exists so that
// none of them copies another's code.
package etcdkv
