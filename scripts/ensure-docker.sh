#!/usr/bin/env bash
# ensure-docker.sh: a Docker engine and the image that pgtemp's Docker provider is tested with
# (fence-pg/tests/conformance_docker_test.go, fence-pg/pgtemp/docker_test.go). Called by
# `make test` and `make test-pg` only (the Makefile's test-deps), after scripts/ensure-deps.sh;
# `make check`, `make test-etcd` and `make lab` never install or start Docker. Safe to run again
# (it only does what is missing).
#
#   - An engine: if `docker info` answers (DOCKER_HOST or the local socket), that one is used.
#     Otherwise, as root on Debian/Ubuntu, the docker.io package is installed (its packaged service
#     kept from starting) and dockerd is started in the background WITHOUT its default bridge
#     network and without touching iptables (--bridge=none --iptables=false --ip-masq=false):
#     pgtemp's containers use the host's network and listen on 127.0.0.1, and no container ever
#     gets a private-range address. Its log: /var/log/leasefence-dockerd.log.
#   - The image leasefence/pgtemp:local (pgtemp.LocalDockerImage), for engines that reach no image
#     registry: built with `docker import` from the PostgreSQL server binaries installed on this
#     machine (initdb, postgres, their modules, share files and shared libraries, a POSIX sh),
#     rebuilt only when those binaries change.
#
# Without an engine and without root, nothing is installed: the Docker provider's tests then skip
# (they fail when CI is set). LEASEFENCE_SKIP_DOCKER=1 skips all of this.
set -euo pipefail

say() { printf 'ensure-docker: %s\n' "$*" >&2; }

image=leasefence/pgtemp:local # = pgtemp.LocalDockerImage
label=leasefence.pgtemp.source
recipe=1 # bump when the image's contents change below
dockerd_log=/var/log/leasefence-dockerd.log

if [ "${LEASEFENCE_SKIP_DOCKER:-}" = 1 ]; then
  say "LEASEFENCE_SKIP_DOCKER=1: not checking Docker; the Docker provider's tests will skip."
  exit 0
fi
if [ "$(uname -s)" != Linux ]; then
  say "not Linux: no engine is started and no image is built from this machine's binaries here."
  say "  With Docker Desktop and a registry: LEASEFENCE_PG_DOCKER=postgres:17 go test ./... runs every cluster in Docker."
  exit 0
fi

engine_up() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

start_dockerd() { # $@: extra flags
  setsid nohup dockerd --bridge=none --iptables=false --ip-masq=false "$@" \
    >>"$dockerd_log" 2>&1 </dev/null &
  local pid=$! i
  for i in $(seq 1 60); do
    if engine_up; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 0.5
  done
  return 1
}

if ! engine_up; then
  if [ -n "${DOCKER_HOST:-}" ]; then
    say "DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local engine. The Docker provider's tests will skip."
    exit 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "no Docker engine answers and this is not root on Debian/Ubuntu: the Docker provider's tests will skip."
    say "  To run them: start Docker (or run this script as root), then make test."
    exit 0
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    say "installing Docker with apt-get (docker.io; its packaged service is not started)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    policy=/usr/sbin/policy-rc.d created=
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\n# ensure-docker.sh: no service starts during this install\nexit 101\n' >"$policy"
      chmod 755 "$policy"
      created=1
    fi
    rc=0
    apt-get install -y -qq docker.io >/dev/null || rc=$?
    if [ -n "$created" ]; then rm -f "$policy"; fi
    [ "$rc" = 0 ] || { say "apt-get install docker.io failed"; exit 1; }
  fi
  say "starting dockerd without bridge network (--bridge=none --iptables=false --ip-masq=false), log $dockerd_log"
  if ! start_dockerd; then
    say "dockerd did not come up with its default storage driver; retrying with --storage-driver=vfs"
    old_pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [ -n "$old_pid" ] && kill -0 "$old_pid" 2>/dev/null; then kill "$old_pid"; sleep 2; fi
    if ! start_dockerd --storage-driver=vfs; then
      say "dockerd did not start; last lines of $dockerd_log:"
      tail -n 20 "$dockerd_log" >&2 || true
      exit 1
    fi
  fi
fi
say "Docker engine: $(docker version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}' 2>/dev/null)"

# The same search order as fence-pg/pgtemp (LEASEFENCE_PG_BINDIR, pg_config, Debian, PGDG, source).
find_pg_bindir() {
  local d
  if [ -n "${LEASEFENCE_PG_BINDIR:-}" ] && [ -x "$LEASEFENCE_PG_BINDIR/postgres" ]; then
    echo "$LEASEFENCE_PG_BINDIR"; return 0
  fi
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$d" ] && [ -x "$d/postgres" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V -r) /usr/pgsql-*/bin /usr/local/pgsql/bin; do
    if [ -x "$d/postgres" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  done
  return 1
}

bindir=$(find_pg_bindir) || { say "no PostgreSQL server binaries to build $image from (scripts/ensure-deps.sh installs them)"; exit 1; }
if [ -x "$bindir/pg_config" ]; then
  pkglibdir=$("$bindir/pg_config" --pkglibdir)
  sharedir=$("$bindir/pg_config" --sharedir)
else
  pkglibdir=$(dirname "$bindir")/lib
  sharedir=/usr/share/postgresql/$(basename "$(dirname "$bindir")")
fi
[ -d "$pkglibdir" ] && [ -f "$sharedir/postgres.bki" ] || {
  say "cannot find the module and share directories of $bindir (looked at $pkglibdir, $sharedir)"; exit 1; }

source_id="recipe $recipe; $("$bindir/postgres" --version); $(sha256sum "$bindir/postgres" | cut -c1-16)"
have=$(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$image" 2>/dev/null || true)
if [ "$have" = "$source_id" ]; then
  say "image $image is up to date ($source_id)"
  exit 0
fi
old_id=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)

say "building $image with docker import from $bindir ($source_id)"
root=$(mktemp -d /tmp/pgtemp-image-XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/usr/lib" "$root/usr/lib64" "$root/etc" "$root/tmp" \
  "$root/dev" "$root/proc" "$root/sys" "$root/var/lib/postgresql" "$root$bindir" "$root$pkglibdir" "$root$(dirname "$sharedir")"
# merged /usr, as on Debian 12: /lib/x/libc.so.6 copied below lands in usr/lib
ln -s usr/bin "$root/bin"; ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"; ln -s usr/bin "$root/sbin"
chmod 1777 "$root/tmp"

shell=$(readlink -f /bin/sh)
progs=("$bindir/postgres" "$bindir/initdb" "$shell")
[ -x "$bindir/pg_controldata" ] && progs+=("$bindir/pg_controldata")
cp -L "$bindir/postgres" "$bindir/initdb" "$root$bindir/"
[ -x "$bindir/pg_controldata" ] && cp -L "$bindir/pg_controldata" "$root$bindir/"
cp -L "$shell" "$root/usr/bin/sh"
# The server's modules, but not the LLVM JIT provider (over 100 MB with libLLVM): without
# llvmjit.so, postgres simply runs without JIT.
modules=()
for m in "$pkglibdir"/*.so; do
  case "$(basename "$m")" in llvmjit*) continue ;; esac
  modules+=("$m")
done
cp -L "${modules[@]}" "$root$pkglibdir/"
cp -a "$sharedir" "$root$(dirname "$sharedir")/"
[ -d /usr/share/zoneinfo ] && { mkdir -p "$root/usr/share"; cp -a /usr/share/zoneinfo "$root/usr/share/"; }

# Shared libraries and the dynamic loader, from ldd, copied under their own paths.
for lib in $(ldd "${progs[@]}" "${modules[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && NF > 1 {print $1}' | sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done

# pgtemp mounts its own passwd and group (the container runs as the data directory's owner);
# these are for running the image by hand.
printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\npostgres:x:999:\n' >"$root/etc/group"

tar -C "$root" --numeric-owner --owner=0 --group=0 -cf - . |
  docker import \
    --change "ENV PATH=$bindir:/usr/bin:/bin" \
    --change "LABEL $label=\"$source_id\"" \
    --change 'USER postgres' \
    - "$image" >/dev/null
say "built $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect -f '{{.Id}}' "$image")" ]; then
  docker image rm "$old_id" >/dev/null 2>&1 || true
fi
