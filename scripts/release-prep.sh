#!/usr/bin/env bash
# release-prep.sh VERSION: prepares the commit to tag (docs/modules.md,
# "Releasing"): every module of go.work requires its siblings at VERSION and
# loses the replace lines that point at the siblings' directories. Those
# lines are ignored in a dependency, but `go install pkg@version` refuses a
# module whose go.mod has any, and the leasefence command is installed that
# way. gomodtest publishes the modules exactly like this.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/release-prep.sh vX.Y.Z}
case $version in v[0-9]*.[0-9]*.[0-9]*) ;; *) echo "release-prep.sh: $version is not vX.Y.Z" >&2; exit 2 ;; esac
prefix=github.com/leasefence/leasefence/
mapfile -t modules < <(sed -n 's#^[[:space:]]*\./\([^[:space:]]*\)$#\1#p' go.work)
for m in "${modules[@]}"; do
  edits=()
  while read -r path; do edits+=("-require=$path@$version"); done < <(
    cd "$m" && go mod edit -json | python3 -c '
import json, sys
d = json.load(sys.stdin)
for r in d.get("Require") or []:
    if r["Path"].startswith(sys.argv[1]): print(r["Path"])' "$prefix")
  while read -r path; do edits+=("-dropreplace=$path"); done < <(
    cd "$m" && go mod edit -json | python3 -c '
import json, sys
d = json.load(sys.stdin)
for r in d.get("Replace") or []:
    if r["Old"]["Path"].startswith(sys.argv[1]): print(r["Old"]["Path"])' "$prefix")
  if [ ${#edits[@]} -gt 0 ]; then
    (cd "$m" && go mod edit "${edits[@]}")
    echo "$m: ${#edits[@]} edits"
  fi
done
echo "Now commit, and tag each published module at this commit as <dir>/$version (docs/modules.md)."
echo "Afterwards restore the replace lines on main (git revert of that commit's go.mod changes), with the requires at $version."
