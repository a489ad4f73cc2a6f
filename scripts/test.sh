#!/usr/bin/env bash
# test.sh: every test of every module, each module on its own (GOWORK=off),
# as `make test` runs it. Tests start their own PostgreSQL clusters and etcd
# servers; nothing needs to be running.
#
# Modules run LEASEFENCE_TEST_JOBS at a time (default 2), the slowest first.
# Most of a module's time is spent waiting — for TTLs to run out, for
# fsyncs, for frozen processes — not computing, so two side by side take
# little longer than the slower alone. With more than one at a time, each
# module tests its packages one after another (go test -p 1), so that no
# more test binaries run at once than before (go test runs a module's
# packages GOMAXPROCS at a time): the timing cases see the load they were
# written for. Each module's output is held in a file and printed whole
# when it ends, so the logs of two modules do not interleave.
# LEASEFENCE_TEST_JOBS=1 runs them one after another, packages in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every module go.work lists (gomodtest checks that no go.mod is missing there).
mapfile -t modules < <(sed -n 's#^[[:space:]]*\./\([^[:space:]]*\)$#\1#p' go.work)
if [ "${#modules[@]}" -eq 0 ]; then
  echo "test.sh: no modules found in go.work" >&2
  exit 1
fi

unformatted=$(gofmt -l "${modules[@]}")
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi

# The workspace builds as a whole too (through go.work).
patterns=()
for m in "${modules[@]}"; do patterns+=("./$m/..."); done
go build "${patterns[@]}"

# The slowest modules first (their last full runs: fence-pg/tests about
# 10 min, fence-etcd/tests 5, the examples 3), so that the others fill the
# second lane meanwhile; the rest in go.work's order.
first=(fence-pg/tests fence-etcd/tests examples/lease-fencing conformance torture)
ordered=()
for m in "${first[@]}"; do
  for x in "${modules[@]}"; do [ "$x" = "$m" ] && ordered+=("$m"); done
done
for m in "${modules[@]}"; do
  case " ${first[*]} " in *" $m "*) ;; *) ordered+=("$m") ;; esac
done

jobs=${LEASEFENCE_TEST_JOBS:-2}
pkgs=()
[ "$jobs" -gt 1 ] && pkgs=(-p 1)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$SECONDS

# run_module runs one module's vet and tests into its log; the log's last
# line is its exit status.
run_module() {
  local m=$1 log=$2 t0=$SECONDS rc=0
  (cd "$m" && GOWORK=off go vet ./... && GOWORK=off go test -race -count=1 -timeout 20m "${pkgs[@]}" ./...) >"$log" 2>&1 || rc=$?
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
  echo "== FAILED: ${failed[*]} ($((SECONDS - start))s)" >&2
  exit 1
fi
echo "== all modules passed ($((SECONDS - start))s, $jobs at a time)"
