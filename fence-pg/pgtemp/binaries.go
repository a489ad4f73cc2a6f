package pgtemp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// installHint is the one thing a user without PostgreSQL needs to read.
const installHint = "Debian/Ubuntu: apt-get install -y postgresql (as root); " +
	"Fedora/RHEL: dnf install postgresql-server; " +
	"macOS: brew install postgresql@16; " +
	"or set LEASEFENCE_PG_BINDIR to the directory holding initdb and postgres; " +
	"or, with a Docker engine, set LEASEFENCE_PG_DOCKER=1 to run PostgreSQL in a container"

// binaries are the two server programs pgtemp runs. They always come from one directory: an
// initdb of one major version writes a data directory that a postgres of another refuses.
type binaries struct {
	dir      string
	initdb   string
	postgres string
}

// findBinaries looks for initdb and postgres. An explicitly named directory (WithBinDir, then
// LEASEFENCE_PG_BINDIR) is authoritative: if it lacks them that is an error, because quietly
// running some other installation would make version-specific results lie. Otherwise the
// well-known places are tried in order, preferring the newest major version.
func findBinaries(ctx context.Context, explicit string) (binaries, error) {
	var looked []string
	try := func(source, dir string) (binaries, bool) {
		b, why := binDir(dir)
		if why != "" {
			looked = append(looked, fmt.Sprintf("%s %s (%s)", source, dir, why))
			return binaries{}, false
		}
		return b, true
	}

	if explicit != "" {
		if b, ok := try("WithBinDir", explicit); ok {
			return b, nil
		}
		return binaries{}, noBinariesError(looked)
	}
	if dir := getenv(envBinDir); dir != "" {
		if b, ok := try(envBinDir, dir); ok {
			return b, nil
		}
		return binaries{}, noBinariesError(looked)
	}

	// pg_config alone proves little: Debian's pg_config comes with libpq-dev and may report the
	// bindir of a version whose server is not installed, hence the check of the directory.
	if dir, err := pgConfigBindir(ctx); err != nil {
		looked = append(looked, "pg_config --bindir ("+err.Error()+")")
	} else if b, ok := try("pg_config --bindir", dir); ok {
		return b, nil
	}

	for _, g := range []struct{ prefix, suffix string }{
		{"/usr/lib/postgresql/", "/bin"}, // Debian, Ubuntu
		{"/usr/pgsql-", "/bin"},          // PGDG packages on Fedora, RHEL
	} {
		dirs := versionedDirs(g.prefix, g.suffix)
		if len(dirs) == 0 {
			looked = append(looked, g.prefix+"*"+g.suffix+" (none)")
		}
		for _, dir := range dirs {
			if b, ok := try("", dir); ok {
				return b, nil
			}
		}
	}

	if b, ok := try("", "/usr/local/pgsql/bin"); ok { // built from source
		return b, nil
	}

	if p, err := exec.LookPath("postgres"); err != nil {
		looked = append(looked, "PATH (no postgres)")
	} else if b, ok := try("PATH", filepath.Dir(p)); ok {
		return b, nil
	}

	// Homebrew's postgresql@N formulae are keg-only: following the install hint on macOS leaves
	// the binaries off PATH, so look where brew puts them.
	for _, prefix := range []string{"/opt/homebrew/opt/postgresql@", "/usr/local/opt/postgresql@"} {
		for _, dir := range versionedDirs(prefix, "/bin") {
			if b, ok := try("", dir); ok {
				return b, nil
			}
		}
	}

	return binaries{}, noBinariesError(looked)
}

// binDir reports whether dir holds both programs, and if not, what is missing.
func binDir(dir string) (binaries, string) {
	b := binaries{
		dir:      dir,
		initdb:   filepath.Join(dir, "initdb"),
		postgres: filepath.Join(dir, "postgres"),
	}
	var missing []string
	for _, p := range []string{b.initdb, b.postgres} {
		if !isExecutable(p) {
			missing = append(missing, "no "+filepath.Base(p))
		}
	}
	if len(missing) > 0 {
		return binaries{}, strings.Join(missing, ", ")
	}
	return b, ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

func pgConfigBindir(ctx context.Context) (string, error) {
	path, err := exec.LookPath("pg_config")
	if err != nil {
		return "", fmt.Errorf("not on PATH")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--bindir").Output()
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("empty output")
	}
	return dir, nil
}

// versionedDirs returns the directories matching prefix*suffix, newest version first, comparing
// the part matched by * numerically so that 9.6 < 10 < 15 < 16 (a string sort puts 9.6 first).
func versionedDirs(prefix, suffix string) []string {
	matches, _ := filepath.Glob(prefix + "*" + suffix)
	version := func(dir string) []int {
		return parseVersion(strings.TrimSuffix(strings.TrimPrefix(dir, prefix), suffix))
	}
	slices.SortStableFunc(matches, func(a, b string) int {
		return slices.Compare(version(b), version(a))
	})
	return matches
}

// parseVersion turns "9.6" into [9 6]; anything that is not a number sorts below every version.
func parseVersion(s string) []int {
	var v []int
	for part := range strings.SplitSeq(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return []int{-1}
		}
		v = append(v, n)
	}
	return v
}

func noBinariesError(looked []string) error {
	return &sentinelError{
		sentinel: ErrNoBinaries,
		msg: "pgtemp: PostgreSQL server binaries (initdb and postgres) not found; looked in: " +
			strings.Join(looked, "; ") + ". To install: " + installHint,
	}
}

// getenv treats a variable set to blanks like an unset one, so "VAR= go test" disables it.
func getenv(key string) string {
	return strings.TrimSpace(os.Getenv(key))
}
