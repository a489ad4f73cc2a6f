module github.com/leasefence/leasefence/conformance

go 1.26.8

require github.com/leasefence/leasefence/leasecore v0.1.0

replace github.com/leasefence/leasefence/leasecore => ../leasecore
