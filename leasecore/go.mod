module github.com/leasefence/leasefence/leasecore

go 1.26.8
