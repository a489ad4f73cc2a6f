package fenceetcd_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoServerDependency: what a user of fence-etcd compiles — fenceetcd,
// its negative controls and its conformance harness — depends on etcd's
// client only. The server (go.etcd.io/etcd/server/..., with bbolt, raft and
// the rest) is for etcdtemp and the tests.
func TestNoServerDependency(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	pkgs := []string{".", "./etcdcontrol", "./etcdconformance"}
	out, err := exec.Command(gobin, append([]string{"list", "-deps"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	var client bool
	for _, d := range deps {
		if strings.HasPrefix(d, "go.etcd.io/etcd/server/") || d == "go.etcd.io/etcd/server" {
			t.Errorf("%v depend on %s", pkgs, d)
		}
		client = client || d == "go.etcd.io/etcd/client/v3"
	}
	if !client {
		t.Fatalf("go list -deps %v lists no go.etcd.io/etcd/client/v3: wrong package list?\n%s", pkgs, out)
	}
}
