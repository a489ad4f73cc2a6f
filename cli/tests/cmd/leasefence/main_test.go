package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/cli/tests/internal/clitest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// build compiles the command once per test into a temporary directory,
// from the cli module as this module requires it (its directory, through
// go.work or the replace line).
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "leasefence")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/leasefence/leasefence/cli/cmd/leasefence").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// execResult is one run of the built binary.
type execResult struct {
	code           int
	stdout, stderr string
}

// runBin runs the binary with exactly env (plus PATH and HOME), so that
// the test machine's own PG* or ETCDCTL_* cannot leak in.
func runBin(t *testing.T, bin string, env []string, args ...string) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("run %q: %v", args, err)
	}
	return execResult{code, out.String(), errOut.String()}
}

// TestBinary runs the built command as an operator would: the manual,
// a usage error, and both backends chosen by the usual environment alone
// (PG*; ETCDCTL_ENDPOINTS), with --json output that parses.
func TestBinary(t *testing.T) {
	bin := build(t)

	r := runBin(t, bin, nil, "--help")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "NAME\n    leasefence - ") || !strings.Contains(r.stdout, "EXIT STATUS") {
		t.Errorf("--help: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runBin(t, bin, nil, "advance", "scope", "not-a-token", "--dsn", "postgres://nobody@127.0.0.1:1/x")
	if r.code != 2 || !strings.Contains(r.stderr, `invalid TOKEN "not-a-token"`) {
		t.Errorf("a bad TOKEN: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	t.Run("postgres from PG*", func(t *testing.T) {
		dsn := clitest.CreateDB(t, "bin")
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		env := []string{"PGHOST=" + cfg.Host, "PGPORT=" + strconv.Itoa(int(cfg.Port)), "PGUSER=" + cfg.User,
			"PGDATABASE=" + cfg.Database, "PGSSLMODE=disable"}
		if r := runBin(t, bin, env, "migrate"); r.code != 0 || !strings.Contains(r.stdout, "leasefence.lease ready") {
			t.Fatalf("migrate from PG*: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		// An application's holder, through the library.
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		leases, err := fencepg.NewLeaseStore(pool)
		if err != nil {
			t.Fatal(err)
		}
		g, err := leases.Acquire(context.Background(), "nightly", "host-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		tokenText := g.Token.String()
		r := runBin(t, bin, env, "status", "--json")
		var doc struct {
			Backend string `json:"backend"`
			Leases  []struct {
				Name, State, Holder string
				Token               uint64
				RemainingMS         int64 `json:"remaining_ms"`
			} `json:"leases"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil || doc.Backend != "postgres" || len(doc.Leases) != 1 ||
			doc.Leases[0].Holder != "host-a" || strconv.FormatUint(doc.Leases[0].Token, 10) != tokenText || doc.Leases[0].RemainingMS <= 0 {
			t.Errorf("status --json from PG*: exit %d %+v\n%s%s", r.code, doc, r.stdout, r.stderr)
		}
		r = runBin(t, bin, env, "break", "nightly", "--scope", "invoices", "--yes")
		if r.code != 0 || !strings.Contains(r.stdout, `ended:    holder "host-a"`) {
			t.Errorf("break from PG*: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r = runBin(t, bin, env, "floors", "invoices=nightly")
		if r.code != 0 || !strings.Contains(r.stdout, "ok") {
			t.Errorf("floors from PG*: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("etcd from ETCDCTL_ENDPOINTS", func(t *testing.T) {
		env := []string{"ETCDCTL_ENDPOINTS=" + strings.Join(clitest.Etcd(t).Endpoints(), ",")}
		prefix := clitest.NewPrefix()
		r := runBin(t, bin, env, "advance", "invoices", "1", "--prefix", prefix)
		if r.code != 0 || !strings.Contains(r.stdout, "floor - -> 1") {
			t.Errorf("advance on etcd: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r = runBin(t, bin, env, "floors", "--prefix", prefix, "--json")
		var doc struct {
			Backend string `json:"backend"`
			Floors  []struct {
				Scope string `json:"scope"`
				Floor uint64 `json:"floor"`
				Check string `json:"check"`
			} `json:"floors"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil || doc.Backend != "etcd" || len(doc.Floors) != 1 ||
			doc.Floors[0].Scope != "invoices" || doc.Floors[0].Floor != 1 || doc.Floors[0].Check != "ok" {
			t.Errorf("floors --json on etcd: exit %d %+v\n%s%s", r.code, doc, r.stdout, r.stderr)
		}
		// No flag at all: the environment alone chooses etcd.
		if r := runBin(t, bin, env, "list", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"backend": "etcd"`) {
			t.Errorf("list from ETCDCTL_ENDPOINTS alone: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		// Both environments: say which.
		r = runBin(t, bin, append(env, "PGHOST=127.0.0.1"), "list")
		if r.code != 2 || !strings.Contains(r.stderr, "both PGHOST and ETCDCTL_ENDPOINTS are set") {
			t.Errorf("both environments: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
}
