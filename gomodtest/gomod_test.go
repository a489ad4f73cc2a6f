package gomodtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSiblingReplaces checks each go.mod of the repository against the
// rule docs/modules.md states: a module carries a replace line for exactly
// the siblings it requires, each pointing at that sibling's directory. A
// replace for a module it does not require is dead weight that hides which
// siblings it needs; a required sibling without one would be fetched at
// its version (not yet tagged) instead of built from the working tree. It
// also fails on a module whose path has an internal element: nothing
// outside the repository could import its packages, yet every user whose
// graph reaches it would need a replace line for it until a release.
func TestSiblingReplaces(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mods := workspaceModules(t, root)
	dirOf := map[string]string{}
	for _, m := range mods {
		dirOf[m.path] = m.dir
	}
	for _, m := range mods {
		if slices.Contains(strings.Split(m.path, "/"), "internal") {
			t.Errorf("%s: a module under internal/ cannot be imported by its users; make it a package of a module they can import", m.path)
		}
		required := map[string]bool{}
		for _, r := range m.file.Require {
			if strings.HasPrefix(r.Mod.Path, repoPrefix) {
				required[r.Mod.Path] = true
			}
		}
		replaced := map[string]bool{}
		for _, r := range m.file.Replace {
			if !strings.HasPrefix(r.Old.Path, repoPrefix) {
				continue
			}
			replaced[r.Old.Path] = true
			if !required[r.Old.Path] {
				t.Errorf("%s: replace %s, which it does not require (go mod tidy removed the require; remove the replace too)", m.path, r.Old.Path)
				continue
			}
			if want := dirOf[r.Old.Path]; filepath.Join(m.dir, filepath.FromSlash(r.New.Path)) != want {
				t.Errorf("%s: replace %s => %s, not the sibling's directory %s", m.path, r.Old.Path, r.New.Path, want)
			}
		}
		for p := range required {
			if !replaced[p] {
				t.Errorf("%s: requires %s without a replace to its directory", m.path, p)
			}
		}
	}
}

// TestDeclaredVersionsAreTested fails when a module requires a third-party
// module directly at a version other than the one the workspace builds
// and tests with (the highest any module of go.work requires). A published
// module's requirement is the minimum its users may get; declaring one
// lower than the tested version (fence-pg at pgx v5.12.0 while every
// module testing it pulled v5.13.0) promises a version no test ran
// against. Raise the declaration to the tested version.
func TestDeclaredVersionsAreTested(t *testing.T) {
	gobin, root := goAndRoot(t)
	mods := workspaceModules(t, root)
	cmd := exec.Command(gobin, "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")
	cmd.Dir = root
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "GOFLAGS=")
	}), "GOWORK="+filepath.Join(root, "go.work"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all in the workspace: %v", err)
	}
	selected := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			selected[f[0]] = f[1]
		}
	}
	n := 0
	for _, m := range mods {
		for _, r := range m.file.Require {
			if r.Indirect || strings.HasPrefix(r.Mod.Path, repoPrefix) {
				continue
			}
			n++
			if v := selected[r.Mod.Path]; v != r.Mod.Version {
				t.Errorf("%s requires %s %s, but the workspace builds and tests it at %s", m.path, r.Mod.Path, r.Mod.Version, v)
			}
		}
	}
	t.Logf("%d direct third-party requirements checked against the workspace's versions", n)
}
