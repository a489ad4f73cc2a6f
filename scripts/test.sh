#!/usr/bin/env bash
# test.sh: the project's tests by tier, each module on its own (GOWORK=off),
# as the Makefile's test targets run them. Tests start their own PostgreSQL
# clusters and etcd servers; nothing needs to be running.
#
#   scripts/test.sh check   gofmt, go vet of every module, the workspace
#                           build, and the tests of every package that starts
#                           no server, with -short (make check)
#   scripts/test.sh pg      the packages whose tests start PostgreSQL and
#                           nothing else (make test-pg)
#   scripts/test.sh etcd    the packages whose tests start etcd and nothing
#                           else (make test-etcd)
#   scripts/test.sh [all]   gofmt, vet, build and every test of every module,
#                           as CI runs it (make test)
#
# Modules are the ones go.work lists (gomodtest checks that no go.mod is
# missing there), so moving or adding a module needs no edit here. Which
# packages start servers is the table server_pkgs below; CONTRIBUTING.md
# gives the rule.
#
# Modules run LEASEFENCE_TEST_JOBS at a time (default 2), the slowest first.
# Most of a module's time is spent waiting — for TTLs to run out, for
# fsyncs, for frozen processes — not computing, so two side by side take
# little longer than the slower alone. With more than one at a time, each
# module of the server tiers tests its packages one after another (go test
# -p 1), so that no more test binaries run at once than when modules ran
# one by one (go test runs a module's packages GOMAXPROCS at a time): the
# timing cases see the load they were written for. Each module's output is
# held in a file and printed whole when it ends, so the logs of two modules
# do not interleave. LEASEFENCE_TEST_JOBS=1 runs them one after another,
# packages in parallel. No two modules share a server: every test starts
# its own, on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

tier=${1:-all}
case "$tier" in
  check | pg | etcd | all) ;;
  *)
    echo "usage: scripts/test.sh [check|pg|etcd|all]" >&2
    exit 2
    ;;
esac

# Packages whose tests start servers, as directories relative to the
# repository ("dir/..." for dir and everything under it), each with the
# servers it needs: pg, etcd, or both (run by `all` only). A package not
# listed here runs in `check`, with -short: a test there that starts a
# server skips under testing.Short() and runs in `all`.
server_pkgs=(
  "pg   fence-pg/tests/..."
  "pg   fence-pg/pgtemp/..."
  "pg   metrics/tests/..."
  "pg   examples/lease-fencing/cmd/report-job"
  "etcd fence-etcd/tests/..."
  "etcd fence-etcd/etcdtemp/..."
  "both cli/tests/..."
  "both gomodtest/..."
  "both examples/lease-fencing/internal/mixed"
)

# servers_of prints what the package in directory $1 (relative) needs:
# pg, etcd, both, or none.
servers_of() {
  local entry need pat
  for entry in "${server_pkgs[@]}"; do
    read -r need pat <<<"$entry"
    case "$pat" in
      */...) [[ "$1" == "${pat%/...}" || "$1" == "${pat%/...}"/* ]] && { echo "$need"; return; } ;;
      *) [ "$1" = "$pat" ] && { echo "$need"; return; } ;;
    esac
  done
  echo none
}

# Every module go.work lists, relative to the repository.
mapfile -t modules < <(go list -m -f '{{.Dir}}' | sed "s#^$root/##")
if [ "${#modules[@]}" -eq 0 ]; then
  echo "test.sh: no modules found in go.work" >&2
  exit 1
fi
patterns=()
for m in "${modules[@]}"; do patterns+=("./$m/..."); done
start=$SECONDS

if [ "$tier" = check ] || [ "$tier" = all ]; then
  unformatted=$(gofmt -l "${modules[@]}")
  if [ -n "$unformatted" ]; then
    echo "gofmt would change:" >&2
    echo "$unformatted" >&2
    exit 1
  fi
  # The workspace builds as a whole too (through go.work).
  go build "${patterns[@]}"
fi

# The packages each module tests in this tier, as arguments for go test
# run in the module's directory ("./..." for all of them); a module with
# none is only vetted (check) or skipped (pg, etcd).
declare -A pkgs_of=()
if [ "$tier" = all ]; then
  for m in "${modules[@]}"; do pkgs_of[$m]=./...; done
else
  while IFS='|' read -r mod dir tests; do
    [ "$tests" = 00 ] && continue # no test files: go vet covers it
    mod=${mod#"$root"}; mod=${mod#/}; dir=${dir#"$root"/}
    need=$(servers_of "$dir")
    case "$tier:$need" in
      check:none | pg:pg | etcd:etcd) ;;
      *) continue ;;
    esac
    rel=.${dir#"$mod"}
    pkgs_of[$mod]+=" $rel"
  done < <(go list -f '{{.Module.Dir}}|{{.Dir}}|{{len .TestGoFiles}}{{len .XTestGoFiles}}' "${patterns[@]}")
fi

# The modules this tier runs: every one for check (go vet of each) and all,
# the ones with packages to test for pg and etcd.
selected=()
for m in "${modules[@]}"; do
  if [ "$tier" = check ] || [ -n "${pkgs_of[$m]:-}" ]; then selected+=("$m"); fi
done
if [ "${#selected[@]}" -eq 0 ]; then
  echo "test.sh: no package to test in tier $tier" >&2
  exit 1
fi

# The slowest modules first (their last full runs: fence-pg/tests about
# 10 min, fence-etcd/tests 5, the examples 3; conformance's in-memory suite
# is most of check), so that the others fill the second lane meanwhile; the
# rest in go.work's order.
first=(fence-pg/tests fence-etcd/tests conformance examples/lease-fencing torture)
ordered=()
for m in "${first[@]}"; do
  for x in "${selected[@]}"; do [ "$x" = "$m" ] && ordered+=("$m"); done
done
for m in "${selected[@]}"; do
  case " ${first[*]} " in *" $m "*) ;; *) ordered+=("$m") ;; esac
done
# In check, the modules only vetted go last: seconds each.
if [ "$tier" = check ]; then
  tested=() vetted=()
  for m in "${ordered[@]}"; do
    if [ -n "${pkgs_of[$m]:-}" ]; then tested+=("$m"); else vetted+=("$m"); fi
  done
  ordered=("${tested[@]}" "${vetted[@]}")
fi

jobs=${LEASEFENCE_TEST_JOBS:-2}
flags=(-race -count=1 -timeout 20m)
[ "$jobs" -gt 1 ] && flags+=(-p 1)
if [ "$tier" = check ]; then
  # The in-memory suites spend their time waiting for TTLs, not computing:
  # more of a package's parallel tests side by side shorten check without
  # loading the CPUs.
  flags=(-race -count=1 -timeout 10m -short -parallel 4)
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# run_module runs one module's vet and tests into its log; the log's last
# line is its exit status.
run_module() {
  local m=$1 log=$2 t0=$SECONDS rc=0 pkgs
  read -r -a pkgs <<<"${pkgs_of[$m]:-}"
  (
    cd "$m"
    GOWORK=off go vet ./...
    if [ "${#pkgs[@]}" -gt 0 ]; then GOWORK=off go test "${flags[@]}" "${pkgs[@]}"; fi
  ) >"$log" 2>&1 || rc=$?
  printf '== %s: %s in %ds\n' "$m" "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)")" $((SECONDS - t0)) >>"$log"
  return "$rc"
}

declare -A pid_of=()
failed=()
# reap waits for one running module, prints its log, and records a failure.
reap() {
  local done_pid rc=0 m
  wait -n -p done_pid || rc=$?
  for m in "${!pid_of[@]}"; do
    if [ "${pid_of[$m]}" = "$done_pid" ]; then
      echo "== $m"
      cat "$logs/${m//\//_}.log"
      [ "$rc" -eq 0 ] || failed+=("$m")
      unset "pid_of[$m]"
      return
    fi
  done
}

for m in "${ordered[@]}"; do
  while [ "${#pid_of[@]}" -ge "$jobs" ]; do reap; done
  run_module "$m" "$logs/${m//\//_}.log" &
  pid_of[$m]=$!
done
while [ "${#pid_of[@]}" -gt 0 ]; do reap; done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "== $tier: FAILED: ${failed[*]} ($((SECONDS - start))s)" >&2
  exit 1
fi
echo "== $tier: all passed (${#ordered[@]} modules, $((SECONDS - start))s, $jobs at a time)"
