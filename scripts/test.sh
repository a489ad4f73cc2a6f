#!/usr/bin/env bash
# test.sh: every test of every module, each module on its own (GOWORK=off),
# as `make test` runs it. Tests start their own PostgreSQL clusters and etcd
# servers; nothing needs to be running.
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

for m in "${modules[@]}"; do
  echo "== $m"
  (cd "$m" && GOWORK=off go vet ./... && GOWORK=off go test -race -count=1 -timeout 20m ./...)
done
echo "== all modules passed"
