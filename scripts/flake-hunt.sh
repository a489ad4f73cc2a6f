#!/usr/bin/env bash
# flake-hunt.sh: run the tests whose outcome depends on time, order or the
# scheduler many times each, under -race, while two CPU burners compete for
# the machine, and write what happened to evidence/flakes/latest.txt.
#
#   scripts/flake-hunt.sh                 every entry of scripts/flake-hunt.list, 20 runs each
#   scripts/flake-hunt.sh -n 5            5 runs each
#   scripts/flake-hunt.sh -only leasecore only the entries whose line matches the regexp
#   make flake-hunt FLAKE_ARGS="-n 5"     the same through make
#
# The whole list takes hours: measured on a loaded 2-CPU machine, one run
# of every entry took 460 s (750 s with the builds), so 20 runs about
# 2.6 hours. `-n 1` measures it again; each entry's first run also prints
# its own estimate.
#
# An entry of the list is a package directory, relative to the repository,
# and optionally a -run pattern (see scripts/flake-hunt.list): fast
# packages whole, the timing cases of the slow server-backed packages by
# pattern. Each entry's test binary is built once with `go test -race -c`
# in its own module (GOWORK=off, as make test runs it); every run is that
# binary run in the package's directory with -test.count=1, which is what
# `go test -race -count=1` runs, without linking the binary again each
# time. A run passes when the binary exits 0 within its timeout (the
# entry's, else 20m). Each failed run's whole output is saved to
# evidence/flakes/failures/<entry>/run-<i>.txt.
#
# The burners are two busy shell loops started here and killed by their
# PIDs on any exit (trap), as are the runs themselves on an interrupt.
# Nothing in evidence/flakes is edited by hand: latest.txt and failures/
# are replaced by each run of this script (FLAKE_OUT to write elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${FLAKE_N:-20}
only=
list=scripts/flake-hunt.list
out=${FLAKE_OUT:-evidence/flakes}
burners=${FLAKE_BURNERS:-2}
while [ $# -gt 0 ]; do
  case $1 in
    -n) n=$2; shift 2 ;;
    -only) only=$2; shift 2 ;;
    -list) list=$2; shift 2 ;;
    -out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "flake-hunt: unknown argument $1" >&2; exit 2 ;;
  esac
done

# The entries: "dir [pattern] [timeout=D]", comments and blank lines dropped.
mapfile -t entries < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$list" | grep -v '^[[:space:]]*$' |
  { if [ -n "$only" ]; then grep -E -- "$only" || true; else cat; fi; })
if [ "${#entries[@]}" -eq 0 ]; then
  echo "flake-hunt: no entries in $list${only:+ matching $only}" >&2
  exit 2
fi

work=$(mktemp -d)
burner_pids=()
run_pid=
cleanup() {
  local p
  [ -n "$run_pid" ] && kill -- "$run_pid" 2>/dev/null || true
  for p in "${burner_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${burner_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "flake-hunt: interrupted" >&2; [ -n "${log:-}" ] && echo "INTERRUPTED after $((SECONDS - start))s" >>"$log"; exit 130' INT TERM

mkdir -p "$out"
rm -rf "$out/failures"
log=$out/latest.txt
start=$SECONDS
say() { printf '%s\n' "$*" | tee -a "$log"; }

: >"$log"
say "# flake hunt: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
say "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!evidence' || echo ' (with uncommitted changes)')"
say "# $(go version); $(nproc) CPUs; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
say "# $n runs per entry, go test -race -count=1 (binary built once per entry), $burners CPU burners running"
say "# list: $list${only:+ (entries matching $only)}"

for _ in $(seq "$burners"); do
  bash -c 'while :; do :; done' &
  burner_pids+=($!)
done
say "# burners: PIDs ${burner_pids[*]}"

# module_of prints the directory of the go.mod that holds dir.
module_of() {
  local d=$1
  while [ "$d" != . ] && [ ! -f "$d/go.mod" ]; do d=$(dirname "$d"); done
  [ -f "$d/go.mod" ] || { echo "flake-hunt: no go.mod above $1" >&2; return 1; }
  echo "$d"
}

total_runs=0 total_failed=0
summary=()
for entry in "${entries[@]}"; do
  read -r dir pattern timeout <<<"$entry"
  case $pattern in timeout=*) timeout=$pattern; pattern= ;; esac
  timeout=${timeout#timeout=}
  timeout=${timeout:-20m}
  mod=$(module_of "$dir")
  rel=.
  [ "$dir" != "$mod" ] && rel=./${dir#"$mod"/}
  slug=$(printf '%s' "$dir${pattern:+_$pattern}" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-120)
  bin=$work/$slug.test
  label="$dir${pattern:+ -run '$pattern'}"
  t0=$SECONDS
  if ! (cd "$mod" && GOWORK=off go test -race -c -o "$bin" "$rel") >"$work/build.txt" 2>&1; then
    mkdir -p "$out/failures/$slug"
    cp "$work/build.txt" "$out/failures/$slug/build.txt"
    say "$label: BUILD FAILED (see failures/$slug/build.txt)"
    summary+=("$label: build failed")
    total_failed=$((total_failed + n))
    continue
  fi
  args=(-test.count=1 -test.timeout="$timeout" -test.paniconexit0)
  [ -n "$pattern" ] && args+=(-test.run="$pattern")
  passed=0 times=()
  for i in $(seq "$n"); do
    r0=$SECONDS
    rc=0
    (cd "$dir" && exec "$bin" "${args[@]}") >"$work/run.txt" 2>&1 &
    run_pid=$!
    wait "$run_pid" || rc=$?
    run_pid=
    took=$((SECONDS - r0))
    times+=("$took")
    total_runs=$((total_runs + 1))
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1))
    else
      total_failed=$((total_failed + 1))
      mkdir -p "$out/failures/$slug"
      { echo "# $label, run $i of $n, exit $rc, ${took}s, $(date -u '+%H:%M:%S UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
        cat "$work/run.txt"; } >"$out/failures/$slug/run-$i.txt"
      say "$label: run $i FAILED (exit $rc, ${took}s): failures/$slug/run-$i.txt"
      grep -E -m 8 -e '^\s*--- FAIL' -e '^panic:' -e 'FAIL ' "$work/run.txt" | sed 's/^/    /' | tee -a "$log" || true
    fi
    if [ "$i" -eq 1 ]; then
      echo "flake-hunt: $label: first run ${took}s, so about $((took * n))s for $n" >&2
    fi
  done
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  line=$(printf '%s: %d of %d passed (run time min %ss, median %ss, max %ss; %ds with the build)' "$label" "$passed" "$n" \
    "$(head -n1 <<<"$sorted")" "$(sed -n "$(((n + 1) / 2))p" <<<"$sorted")" "$(tail -n1 <<<"$sorted")" $((SECONDS - t0)))
  say "$line"
  summary+=("$line")
done

say ""
say "# summary ($total_runs runs, $total_failed failed), load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
for s in "${summary[@]}"; do say "$s"; done
say "# total time: $((SECONDS - start))s"
[ "$total_failed" -eq 0 ]
