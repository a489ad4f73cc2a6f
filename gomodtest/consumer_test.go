package gomodtest

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// repoPrefix is the module path prefix of every module in the repository.
const repoPrefix = "github.com/leasefence/leasefence/"

// repoModule is one module of the repository.
type repoModule struct {
	dir  string // absolute
	path string // module path
	file *modfile.File
}

// TestConsumersWithoutReplace publishes every module of the working tree to
// a file-based module proxy (the layout and zip format of the GOPROXY
// protocol), then builds modules outside the repository that require
// leasefence by version only — no replace directive, no go.work — as a
// user's module does once the repository is tagged. The proxy is
// generated from the working tree on every run, so what is checked is the
// code under test, not a published copy.
func TestConsumersWithoutReplace(t *testing.T) {
	gobin, root := goAndRoot(t)
	mods := workspaceModules(t, root)
	version := siblingVersion(t, mods)
	t.Logf("publishing %d modules at %s", len(mods), version)

	proxy := t.TempDir()
	for _, m := range mods {
		publish(t, proxy, m, version)
	}
	env := consumerEnv(t, gobin, proxy, version)

	// A user of the etcd backend: its module graph must not contain the
	// etcd server (etcdtemp's dependency) nor any test harness.
	etcdUser := consumer(t, gobin, env, "example.com/etcduser", version,
		[]string{"fence-etcd", "leasecore"}, nil, map[string]string{"main.go": etcdUserMain})
	requireAbsent(t, "fence-etcd user", etcdUser,
		"go.etcd.io/etcd/server", "go.etcd.io/bbolt", "go.etcd.io/raft",
		repoPrefix+"conformance", repoPrefix+"fence-etcd/etcdtemp", repoPrefix+"fence-etcd/etcdconformance",
	)
	requirePresent(t, "fence-etcd user", etcdUser, "go.etcd.io/etcd/client/v3")

	// A user of the PostgreSQL backend: pgx, and nothing of the tests
	// (lib/pq, Docker, throwaway clusters, the suite).
	pgUser := consumer(t, gobin, env, "example.com/pguser", version,
		[]string{"fence-pg", "leasecore"}, nil, map[string]string{"main.go": pgUserMain})
	requireAbsent(t, "fence-pg user", pgUser,
		"github.com/lib/pq", "github.com/ory/dockertest", "github.com/docker/docker",
		repoPrefix+"conformance", repoPrefix+"fence-pg/pgtemp", repoPrefix+"fence-pg/pgconformance",
		"go.etcd.io/etcd", "go.uber.org/goleak")
	requirePresent(t, "fence-pg user", pgUser, "github.com/jackc/pgx/v5")

	// A user of the Prometheus collectors: client_golang, and neither a
	// backend nor anything of the tests (the metrics module's server tests
	// are a module of their own).
	metricsUser := consumer(t, gobin, env, "example.com/metricsuser", version,
		[]string{"metrics", "leasecore"}, nil, map[string]string{"main.go": metricsUserMain})
	requireAbsent(t, "metrics user", metricsUser,
		"github.com/jackc/pgx", "go.etcd.io/etcd", "github.com/ory/dockertest",
		repoPrefix+"fence-pg", repoPrefix+"fence-etcd", repoPrefix+"conformance", repoPrefix+"metrics/tests")
	requirePresent(t, "metrics user", metricsUser, "github.com/prometheus/client_golang")

	// A third-party backend author's test module: the suite, both
	// harnesses and both throwaway servers, also by version only. Its
	// graph does contain the etcd server — the positive control showing
	// the absence checks above look at a graph that would show it.
	harnessUser := consumer(t, gobin, env, "example.com/harnessuser", version,
		[]string{"conformance", "fence-pg/pgtemp", "fence-pg/pgconformance", "fence-etcd/etcdtemp",
			"fence-etcd/etcdconformance", "leasecore"},
		nil, map[string]string{"harness.go": "package harnessuser\n", "harness_test.go": harnessUserTest})
	requirePresent(t, "harness user", harnessUser, "go.etcd.io/etcd/server/v3", "github.com/ory/dockertest/v3")

	// An operator installs the command by version, outside any module;
	// go install loads the cli module's published go.mod as the main
	// module, so the command's graph is that go.mod's. The command's tests
	// and their servers are the cli/tests module: none of them may be in
	// it (cli's go.mod once listed the etcd server and dockertest, pulled
	// in by those tests).
	installCommand(t, gobin, env, version)
	cliGraph := publishedGraph(t, gobin, env, proxy, repoPrefix+"cli", version)
	requireAbsent(t, "cli (go install)", cliGraph,
		"go.etcd.io/etcd/server", "go.etcd.io/bbolt", "go.etcd.io/raft",
		"github.com/ory/dockertest", "github.com/docker/docker", "github.com/lib/pq",
		repoPrefix+"conformance", repoPrefix+"fence-pg/pgtemp", repoPrefix+"fence-pg/pgconformance",
		repoPrefix+"fence-etcd/etcdtemp", repoPrefix+"fence-etcd/etcdconformance", repoPrefix+"cli/tests")
	requirePresent(t, "cli (go install)", cliGraph, "github.com/jackc/pgx/v5", "go.etcd.io/etcd/client/v3")
}

// publishedGraph returns the module graph (go mod graph) of the module
// path as published at version in the proxy, with its go.mod as the main
// module: what go install path/...@version resolves.
func publishedGraph(t *testing.T, gobin string, env []string, proxy, path, version string) string {
	t.Helper()
	escaped, err := module.EscapePath(path)
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(proxy, filepath.FromSlash(escaped), "@v", version+".mod"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), gomod, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gobin, "mod", "graph")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s@%s: go mod graph: %v\n%s", path, version, err, out)
	}
	return string(out)
}

// installCommand runs go install .../cli/cmd/leasefence@version from a
// directory outside any module and checks that the binary runs.
func installCommand(t *testing.T, gobin string, env []string, version string) {
	t.Helper()
	bin := t.TempDir()
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "GOFLAGS=") })
	// go install pkg@version ignores the current module; -mod is not
	// allowed with it.
	env = append(env, "GOBIN="+bin, "GOFLAGS=-modcacherw -buildvcs=false")
	cmd := exec.Command(gobin, "install", repoPrefix+"cli/cmd/leasefence@"+version)
	cmd.Dir, cmd.Env = t.TempDir(), env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %scli/cmd/leasefence@%s: %v\n%s", repoPrefix, version, err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "leasefence"), "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "NAME") {
		t.Fatalf("leasefence --help after go install: %v\n%s", err, out)
	}
	t.Logf("go install %scli/cmd/leasefence@%s: the command runs (--help: %d bytes)", repoPrefix, version, len(out))
}

// workspaceModules returns the modules go.work lists, except this one,
// and fails if a go.mod in the tree is missing from go.work (it would be
// neither tested by `make test` nor published here).
func workspaceModules(t *testing.T, root string) []repoModule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	var mods []repoModule
	for _, u := range work.Use {
		dir := filepath.Join(root, filepath.FromSlash(u.Path))
		listed[dir] = true
		gomod := filepath.Join(dir, "go.mod")
		data, err := os.ReadFile(gomod)
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.Parse(gomod, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.Module.Mod.Path == repoPrefix+"gomodtest" {
			continue
		}
		mods = append(mods, repoModule{dir: dir, path: f.Module.Mod.Path, file: f})
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "evidence") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" && !listed[filepath.Dir(p)] {
			t.Errorf("%s is not listed in go.work", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

// siblingVersion returns the one version at which modules of the
// repository require each other, and fails on a second one: the
// repository is tagged at one version for every module.
func siblingVersion(t *testing.T, mods []repoModule) string {
	t.Helper()
	var version string
	for _, m := range mods {
		for _, r := range m.file.Require {
			if !strings.HasPrefix(r.Mod.Path, repoPrefix) {
				continue
			}
			switch {
			case version == "":
				version = r.Mod.Version
			case r.Mod.Version != version:
				t.Fatalf("%s requires %s at %s; other modules require siblings at %s", m.path, r.Mod.Path, r.Mod.Version, version)
			}
		}
	}
	if version == "" {
		t.Fatal("no module requires a sibling")
	}
	return version
}

// publish writes m at version into the file-based proxy: list, .info,
// .mod and .zip under <path>/@v/, as the GOPROXY protocol defines them.
// modzip.CreateFromDir leaves out nested modules (fence-pg's zip does not
// contain fence-pg/tests), as the go command does for a tagged module.
func publish(t *testing.T, proxy string, m repoModule, version string) {
	t.Helper()
	escaped, err := module.EscapePath(m.path)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("list", []byte(version+"\n"))
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC()})
	write(version+".info", info)
	gomod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gomod = releasedGoMod(t, m.path, gomod)
	write(version+".mod", gomod)
	var zbuf bytes.Buffer
	if err := modzip.CreateFromDir(&zbuf, module.Version{Path: m.path, Version: version}, m.dir); err != nil {
		t.Fatalf("zip %s: %v", m.path, err)
	}
	write(version+".zip", withGoMod(t, zbuf.Bytes(), m.path+"@"+version+"/go.mod", gomod))
	checkNoNestedModule(t, filepath.Join(dir, version+".zip"), m)
}

// releasedGoMod is gomod as scripts/release-prep.sh leaves it in the
// tagged commit: without the replace lines that point at siblings'
// directories. They are ignored in a dependency anyway, but go install
// pkg@version refuses a module whose go.mod has any (the leasefence
// command is installed that way).
func releasedGoMod(t *testing.T, path string, gomod []byte) []byte {
	t.Helper()
	f, err := modfile.Parse(path+"/go.mod", gomod, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Replace {
		if strings.HasPrefix(r.Old.Path, repoPrefix) {
			if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.Cleanup()
	out, err := f.Format()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// withGoMod returns the module zip z with the file name replaced by gomod.
func withGoMod(t *testing.T, z []byte, name string, gomod []byte) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	zw := zip.NewWriter(&out)
	for _, f := range zr.File {
		w, err := zw.Create(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name == name {
			_, err = w.Write(gomod)
		} else {
			var rc io.ReadCloser
			if rc, err = f.Open(); err == nil {
				_, err = io.Copy(w, rc)
				rc.Close()
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// checkNoNestedModule fails if the zip of m holds a go.mod other than its
// own: a nested module's files would then be part of m.
func checkNoNestedModule(t *testing.T, zipPath string, m repoModule) {
	t.Helper()
	zr, err := zip.OpenReader(zipPath)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, "/go.mod") && strings.Count(strings.TrimPrefix(f.Name, m.path+"@"), "/") > 1 {
			t.Errorf("the zip of %s contains %s", m.path, f.Name)
		}
	}
}

// consumerEnv is the go command's environment for the consumer modules:
// the generated proxy first, then the configured proxy. The module cache
// is this machine's, so the consumers' third-party packages hit the build
// cache of the repository's own builds; leasefence's modules at version
// are removed from it before and after the run, so they come from the
// proxy just generated, never from a copy extracted by an earlier run of
// other code at the same version (the module cache trusts a version it
// holds).
func consumerEnv(t *testing.T, gobin, proxy, version string) []string {
	t.Helper()
	out, err := exec.Command(gobin, "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("go env: %q", out)
	}
	modcache := lines[0]
	purge := func() {
		for _, pattern := range []string{
			filepath.Join(modcache, "github.com", "leasefence", "leasefence*@"+version),
			filepath.Join(modcache, "github.com", "leasefence", "leasefence", "*@"+version),
			filepath.Join(modcache, "github.com", "leasefence", "leasefence", "*", "*@"+version),
			filepath.Join(modcache, "github.com", "leasefence", "leasefence", "*", "*", "*@"+version),
			filepath.Join(modcache, "cache", "download", "github.com", "leasefence", "leasefence", "*", "@v", version+".*"),
			filepath.Join(modcache, "cache", "download", "github.com", "leasefence", "leasefence", "*", "*", "@v", version+".*"),
			filepath.Join(modcache, "cache", "download", "github.com", "leasefence", "leasefence", "*", "*", "*", "@v", version+".*"),
		} {
			matches, _ := filepath.Glob(pattern)
			for _, m := range matches {
				if err := os.RemoveAll(m); err != nil {
					t.Errorf("purge the module cache: %v", err)
				}
			}
		}
	}
	purge()
	t.Cleanup(purge)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, k := range []string{"GOWORK=", "GOPROXY=", "GOFLAGS=", "GONOSUMDB=", "GOSUMDB=", "GOPRIVATE=", "GONOPROXY=", "GODEBUG="} {
			if strings.HasPrefix(kv, k) {
				return true
			}
		}
		return false
	})
	return append(env,
		"GOWORK=off",
		"GOPROXY=file://"+filepath.ToSlash(proxy)+","+lines[1],
		// -modcacherw: what the consumers extract can be purged again.
		"GOFLAGS=-mod=mod -modcacherw -buildvcs=false",
		// The generated modules are not in the public checksum database;
		// checksums are not what this test is about.
		"GOSUMDB=off",
		// No module index: the go command indexes a package's files and
		// imports per module-cache directory, keyed by its path alone
		// (module@version content is immutable), and keeps the index in
		// the build cache, which purge does not touch. This test publishes
		// v0.1.0 again with every run, so after an import was added to a
		// non-test package the index of the last run still lacked it and
		// the consumer's build failed ("could not import ... (open : no
		// such file or directory)").
		"GODEBUG=goindex=0",
	)
}

// consumer writes a module outside the repository that requires each of
// deps (repository-relative module paths) at version, with a replace line
// for each of replaces (repository-relative module path to directory) and
// files, runs go mod tidy, go vet and go build on it, checks that its
// go.mod has exactly the replace lines it was given, and returns its
// module graph (go mod graph).
func consumer(t *testing.T, gobin string, env []string, path, version string, deps []string, replaces map[string]string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	fmt.Fprintf(&b, "module %s\n\ngo 1.26.8\n\nrequire (\n", path)
	for _, d := range deps {
		fmt.Fprintf(&b, "\t%s%s %s\n", repoPrefix, d, version)
	}
	b.WriteString(")\n")
	for _, m := range slices.Sorted(maps.Keys(replaces)) {
		fmt.Fprintf(&b, "\nreplace %s%s => %s\n", repoPrefix, m, replaces[m])
	}
	files["go.mod"] = b.String()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		cmd := exec.Command(gobin, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: go %s: %v\n%s", path, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "tidy")
	run("vet", "./...")
	run("build", "./...")
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Replace) != len(replaces) {
		t.Errorf("%s: go.mod has %d replace directives after tidy, want %d:\n%s", path, len(f.Replace), len(replaces), data)
	}
	for _, d := range deps {
		if !slices.ContainsFunc(f.Require, func(r *modfile.Require) bool { return r.Mod.Path == repoPrefix+d && r.Mod.Version == version }) {
			t.Errorf("%s: go.mod does not require %s%s %s after tidy:\n%s", path, repoPrefix, d, version, data)
		}
	}
	return run("mod", "graph")
}

// requireAbsent fails for every module path prefix found in graph.
func requireAbsent(t *testing.T, who, graph string, prefixes ...string) {
	t.Helper()
	found := false
	for _, p := range prefixes {
		for _, line := range strings.Split(graph, "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[1], p) {
				t.Errorf("%s: module graph contains %s (edge %q)", who, p, line)
				found = true
				break
			}
		}
	}
	if found {
		return
	}
	t.Logf("%s: module graph has %d edges, none to %s", who, strings.Count(graph, "\n"), strings.Join(prefixes, ", "))
}

// requirePresent fails for every module path prefix not found in graph.
func requirePresent(t *testing.T, who, graph string, prefixes ...string) {
	t.Helper()
	for _, p := range prefixes {
		if !strings.Contains(graph, " "+p) {
			t.Errorf("%s: module graph lacks %s:\n%s", who, p, graph)
		}
	}
}

// etcdUserMain is what a user of the etcd backend compiles: the README's
// constructors on an etcd client.
const etcdUserMain = `package main

import (
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

func main() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	leases, err := fenceetcd.NewLeaseStore(cli)
	if err != nil {
		log.Fatal(err)
	}
	var _ leasecore.Lease = leases
	if _, err := fenceetcd.NewFence(cli); err != nil {
		log.Fatal(err)
	}
}
`

// pgUserMain is what a user of the PostgreSQL backend compiles.
const pgUserMain = `package main

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	leases, err := fencepg.NewLeaseStore(pool)
	if err != nil {
		log.Fatal(err)
	}
	var _ leasecore.Lease = leases
	if _, err := fencepg.NewFence(pool); err != nil {
		log.Fatal(err)
	}
}
`

// metricsUserMain is what a user of the collectors compiles: the README's
// registration and observers.
const metricsUserMain = `package main

import (
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefence/leasefence/leasecore"
	leasefencemetrics "github.com/leasefence/leasefence/metrics"
)

func main() {
	m, err := leasefencemetrics.New(prometheus.NewRegistry())
	if err != nil {
		log.Fatal(err)
	}
	_ = leasecore.WithSessionObserver(m.ObserveSession)
	_ = leasecore.WithCampaignObserver(m.ObserveCampaign)
	var _ func(leasecore.FenceEvent) = m.ObserveFence
}
`

// harnessUserTest is a backend author's test file: the suite run on both
// of leasefence's harnesses with throwaway servers (compiled, not run).
const harnessUserTest = `package harnessuser

import (
	"context"
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

var (
	_ = pgtemp.Start
	_ = etcdtemp.Start
	_ = pgconformance.New
	_ = etcdconformance.New
)

func TestSuite(t *testing.T) {
	_ = context.Background()
	var newHarness conformance.NewHarness
	if newHarness != nil {
		conformance.Run(t, newHarness)
	}
}
`

// goAndRoot returns the go command's path and the repository's root, one
// level up, as an absolute path.
func goAndRoot(t *testing.T) (gobin, root string) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err = filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return gobin, root
}
