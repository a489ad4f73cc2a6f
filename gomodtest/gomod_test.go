package gomodtest

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSiblingReplaces checks each go.mod of the repository against the
// rule docs/modules.md states: a module carries a replace line for exactly
// the siblings it requires, each pointing at that sibling's directory. A
// replace for a module it does not require is dead weight that hides which
// siblings it needs; a required sibling without one would be fetched at
// its version (not yet tagged) instead of built from the working tree.
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
