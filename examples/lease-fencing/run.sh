#!/usr/bin/env bash
# run.sh: the lab, from a fresh clone. Builds the lab command, which starts a
# temporary PostgreSQL cluster on 127.0.0.1:55426, recreates lease26 and
# res26, runs the conformance cases F1-F18, X1 and X2 for every backend
# configuration, writes evidence/26/ and stops everything it started (also
# on Ctrl-C or failure). Exits non-zero on any failed check.
#
# `make lab` runs it after installing what is missing (scripts/ensure-deps.sh:
# PostgreSQL's binaries). The lab needs no Docker and installs none.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "lab: building"
(cd "$here" && go build -o "$tmp/lab" ./cmd/lab)
# Ctrl-C reaches the lab too (same process group); its handler stops the
# cluster before it exits, then the trap removes the build.
"$tmp/lab" -out "$root/evidence/26" "$@"
