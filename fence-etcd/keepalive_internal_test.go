package fenceetcd

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// ownKV tells the client's own KV from a wrapper; no server is needed
// (clientv3.New connects lazily).
func TestOwnKV(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if !ownKV(cli) {
		t.Errorf("ownKV of a new client's KV (%T) = false", cli.KV)
	}
	cli.KV = namespace.NewKV(cli.KV, "/tenant-a")
	if ownKV(cli) {
		t.Errorf("ownKV of a namespace KV (%T) = true", cli.KV)
	}
}
