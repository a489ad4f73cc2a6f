package authorharness_test

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestREADMECopy: conformance/README.md shows harness_test.go from its
// import block on, verbatim, so that the snippet authors copy is the code that compiles
// and passes here.
func TestREADMECopy(t *testing.T) {
	readme, err := os.ReadFile("../../../conformance/README.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("not in a checkout of the repository: no conformance/README.md three levels up")
	} else if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("harness_test.go")
	if err != nil {
		t.Fatal(err)
	}
	code := string(src)
	i := strings.Index(code, "import (")
	if i < 0 {
		t.Fatal("harness_test.go has no import block")
	}
	snippet := "```go\n" + strings.TrimRight(code[i:], "\n") + "\n```"
	if !strings.Contains(string(readme), snippet) {
		t.Errorf("conformance/README.md's harness snippet differs from harness_test.go (from its import block on): copy the file into it")
	}
}
