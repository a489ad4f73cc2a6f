package gomodtest

import (
	"path/filepath"
	"strings"
	"testing"
)

// beforeATag is the table of docs/modules.md, "Before a tag exists": for
// each kind of user outside the repository, the leasefence modules its
// go.mod requires and those it must replace with a checkout's directories
// (its own replace lines are the only ones the go command applies, so
// every leasefence module in its graph needs one).
var beforeATag = []struct {
	who      string
	path     string // the consumer's module path
	requires []string
	replaces []string
	files    map[string]string
}{
	{"fence-pg user", "example.com/pguser", []string{"fence-pg", "leasecore"},
		[]string{"fence-pg", "leasecore"},
		map[string]string{"main.go": pgUserMain}},
	{"fence-etcd user", "example.com/etcduser", []string{"fence-etcd", "leasecore"},
		[]string{"fence-etcd", "leasecore"},
		map[string]string{"main.go": etcdUserMain}},
	{"metrics user", "example.com/metricsuser", []string{"metrics", "leasecore"},
		[]string{"metrics", "leasecore"},
		map[string]string{"main.go": metricsUserMain}},
	{"backend author, the suite on PostgreSQL", "example.com/pgauthor", []string{"conformance", "fence-pg/pgtemp", "fence-pg/pgconformance", "leasecore"},
		[]string{"conformance", "fence-pg", "fence-pg/pgtemp", "fence-pg/pgconformance", "leasecore"},
		map[string]string{"harness.go": "package harnessuser\n", "harness_test.go": pgHarnessUserTest}},
	{"backend author, the suite on etcd", "example.com/etcdauthor", []string{"conformance", "fence-etcd/etcdtemp", "fence-etcd/etcdconformance", "leasecore"},
		[]string{"conformance", "fence-etcd", "fence-etcd/etcdtemp", "fence-etcd/etcdconformance", "leasecore"},
		map[string]string{"harness.go": "package harnessuser\n", "harness_test.go": etcdHarnessUserTest}},
}

// TestConsumersBeforeATag builds, for each row of beforeATag, a module
// outside the repository that requires leasefence at the repository's one
// version and replaces exactly the listed modules with their directories
// in this checkout, as docs/modules.md tells a user to until a release is
// tagged. Every other leasefence module is unreachable (GOPRIVATE with
// GOVCS off: no proxy, no VCS), so a module missing from a row fails go
// mod tidy; a listed module that is not in the consumer's graph fails the
// test too, so each row is exactly what that user needs.
func TestConsumersBeforeATag(t *testing.T) {
	gobin, root := goAndRoot(t)
	version := siblingVersion(t, workspaceModules(t, root))
	env := append(consumerEnv(t, gobin, t.TempDir(), version),
		"GOPRIVATE=github.com/leasefence", "GOVCS=github.com/leasefence:off")
	for _, c := range beforeATag {
		replaces := map[string]string{}
		for _, m := range c.replaces {
			replaces[m] = filepath.Join(root, filepath.FromSlash(m))
		}
		files := map[string]string{}
		for name, content := range c.files {
			files[name] = content
		}
		graph := consumer(t, gobin, env, c.path, version, c.requires, replaces, files)
		for _, m := range c.replaces {
			if !strings.Contains(graph, " "+repoPrefix+m+"@"+version+"\n") {
				t.Errorf("%s: replaces %s, which is not in its module graph", c.who, m)
			}
		}
		t.Logf("%s: builds with replace lines for %s", c.who, strings.Join(c.replaces, ", "))
	}
}

// pgHarnessUserTest is a backend author's test file for the suite on
// PostgreSQL (compiled, not run).
const pgHarnessUserTest = `package harnessuser

import (
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

var _ = pgtemp.Start

func TestSuite(t *testing.T) {
	var cfg pgconformance.Config
	if cfg.Driver != "" {
		conformance.Run(t, pgconformance.New(cfg))
	}
}
`

// etcdHarnessUserTest is a backend author's test file for the suite on
// etcd (compiled, not run).
const etcdHarnessUserTest = `package harnessuser

import (
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

var (
	_ = etcdtemp.Start
	_ = etcdconformance.New
)

func TestSuite(t *testing.T) {
	var newHarness conformance.NewHarness
	if newHarness != nil {
		conformance.Run(t, newHarness)
	}
}
`
