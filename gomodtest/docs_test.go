package gomodtest

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsGoBlocks: every ```go block of the repository's Markdown
// (README.md, docs/, conformance/README.md, …) is a run of consecutive
// lines of a Go file that compiles with its package's tests — an example,
// a test, or a function kept for the docs such as
// fence-pg/example_docs_test.go — shifted left by a whole number of tabs.
// A change of the API then breaks that file's build, and a change of the
// file without the docs (or the other way round) fails here, naming the
// block, so the docs cannot drift from the API.
func TestDocsGoBlocks(t *testing.T) {
	root := checkoutRoot(t)
	docs := map[string][]byte{}      // Markdown file → its contents
	sources := map[string][]string{} // Go file → its lines
	walkRepo(t, root, func(path string, b []byte) {
		switch filepath.Ext(path) {
		case ".md":
			docs[path] = b
		case ".go":
			if !bytes.Contains(b, []byte("//go:build ignore")) { // else never compiled
				sources[path] = strings.Split(string(b), "\n")
			}
		}
	}, "testdata", "vendor")
	blocks := 0
	for doc, md := range docs {
		for _, b := range goBlocks(t, doc, md) {
			blocks++
			if !foundIn(b.lines, sources) {
				rel, _ := filepath.Rel(root, doc)
				t.Errorf("%s:%d: this Go block is no run of lines of a Go file in the repository: "+
					"put the code in an example or test that compiles (e.g. fence-pg/example_docs_test.go) and copy it from there", rel, b.line)
			}
		}
	}
	if blocks == 0 {
		t.Fatal("no ```go block found in the repository's Markdown: the walk is broken")
	}
	t.Logf("%d Go blocks in %d Markdown files, each checked against the compiled Go files", blocks, len(docs))
}

type goBlock struct {
	line  int // of the opening fence, 1-based
	lines []string
}

// goBlocks returns the ```go blocks of md, the Markdown file at path.
func goBlocks(t *testing.T, path string, md []byte) []goBlock {
	t.Helper()
	var out []goBlock
	var cur *goBlock
	var indent string // of the opening fence: a block inside a list item is indented as a whole
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &goBlock{line: n}
			indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, strings.TrimPrefix(line, indent))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```go block that never ends", path, cur.line)
	}
	return out
}

// foundIn reports whether block is a run of consecutive lines of one of
// the sources, every line shifted by the same number of tabs (empty lines
// match empty lines).
func foundIn(block []string, sources map[string][]string) bool {
	if len(block) == 0 {
		return true
	}
	first := block[0]
	for _, lines := range sources {
		for i := 0; i+len(block) <= len(lines); i++ {
			indent, ok := strings.CutSuffix(lines[i], first)
			if !ok || strings.Trim(indent, "\t") != "" {
				continue
			}
			match := true
			for j, want := range block[1:] {
				got := lines[i+1+j]
				if want == "" && got == "" {
					continue
				}
				if got != indent+want {
					match = false
					break
				}
			}
			if match {
				return true
			}
		}
	}
	return false
}

// TestNoUnfollowableReferences: code, docs and the Makefile cite what a
// reader can follow (a conformance case, a docs page, a SOURCES.md entry),
// never a tracker's issue number or a design file the repository does not
// have. evidence/ holds recorded output and is left as it was recorded.
func TestNoUnfollowableReferences(t *testing.T) {
	// Built from pieces so that this file does not match itself.
	bad := regexp.MustCompile(`(?i)issue [0-9]|` + "SP" + `EC F`)
	root := checkoutRoot(t)
	walkRepo(t, root, func(path string, b []byte) {
		if ext := filepath.Ext(path); ext != ".go" && ext != ".md" && filepath.Base(path) != "Makefile" {
			return
		}
		for i, line := range strings.Split(string(b), "\n") {
			if bad.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %q: cite the behaviour, a conformance case, a docs page or a SOURCES.md entry instead", rel, i+1, strings.TrimSpace(line))
			}
		}
	})
}

// TestDocsLinks: every relative link of the repository's Markdown names a
// file or directory that exists, so a reader following the docs never
// lands nowhere.
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	links := 0
	root := checkoutRoot(t)
	walkRepo(t, root, func(path string, b []byte) {
		if filepath.Ext(path) != ".md" {
			return
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
					rel, _ := filepath.Rel(root, path)
					t.Errorf("%s:%d: link to %s: %v", rel, i+1, m[1], err)
				}
			}
		}
	})
	if links == 0 {
		t.Fatal("no relative link found in the repository's Markdown: the walk is broken")
	}
}

// checkoutRoot returns the repository's root, one level up, and skips
// the test outside a checkout of it.
func checkoutRoot(t *testing.T) string {
	t.Helper()
	root := ".."
	if _, err := os.Stat(filepath.Join(root, "go.work")); errors.Is(err, fs.ErrNotExist) {
		t.Skip("not in a checkout of the repository: no go.work one level up")
	}
	return root
}

// walkRepo calls visit with the path and contents of every Markdown and
// Go file and every Makefile under root, leaving out hidden directories,
// evidence/ (recorded output, left as it was recorded) and the directories
// named in skip.
func walkRepo(t *testing.T, root string, visit func(path string, contents []byte), skip ...string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "evidence" || slices.Contains(skip, name)) {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(name); ext != ".md" && ext != ".go" && name != "Makefile" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		visit(path, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
