#!/usr/bin/env bash
# ensure-deps.sh: make sure this machine has what the PostgreSQL-backed tests
# and the lab need, installing it where we can.
#
#   scripts/ensure-deps.sh            Go, PostgreSQL's binaries, the OS user
#                                     (make lab, bench, capacity, torture)
#   scripts/ensure-deps.sh pgbouncer  PgBouncer too (make test, make test-pg,
#                                     make flake-hunt)
#   scripts/ensure-deps.sh patroni    Patroni and etcd's server program too
#                                     (make test, make test-pg)
#
# `make check` and `make test-etcd` need Go only and do not call it. Docker is
# scripts/ensure-docker.sh's, which only `make test` and `make test-pg` run.
#
#   - Go 1.26 or newer (not installed here: see README).
#   - PostgreSQL server binaries (initdb, postgres): installed with apt-get
#     when running as root on Debian/Ubuntu; otherwise we say what to install.
#   - As root: an unprivileged OS user `postgres`, because PostgreSQL refuses
#     to run as root.
#   - With the argument pgbouncer, PgBouncer (the pgbouncer program): the
#     conformance suite also runs behind it in pool_mode=transaction
#     (fence-pg/tests/internal/pgbouncertest starts its own process on a free
#     127.0.0.1 port). Installed with apt-get as root on Debian/Ubuntu, with
#     the package's own service kept from starting; otherwise we say what to
#     install.
#   - With the argument patroni, Patroni (the patroni program) and Debian's
#     etcd server (the etcd program, Patroni's store of leader keys): the
#     failover case F16 also runs on clusters Patroni manages
#     (fence-pg/pgtemp's StartPatroni starts its own processes on loopback).
#     Installed with apt-get as root on Debian/Ubuntu, the packages' services
#     kept from starting; otherwise we say what to install.
# The project's own etcd needs nothing here: it is built from Go modules
# (go.etcd.io/etcd/server/v3).
set -euo pipefail

say() { printf 'ensure-deps: %s\n' "$*" >&2; }

want_pgbouncer=
want_patroni=
for arg in "$@"; do
  case "$arg" in
    pgbouncer) want_pgbouncer=1 ;;
    patroni) want_patroni=1 ;;
    *) say "unknown argument $arg (usage: scripts/ensure-deps.sh [pgbouncer] [patroni])"; exit 2 ;;
  esac
done

if ! command -v go >/dev/null 2>&1; then
  say "Go is not on PATH. Install Go 1.26 or newer (https://go.dev/dl/) and retry."
  exit 1
fi
gover=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n1.26\n' "$gover" | sort -V | head -n1)" != "1.26" ]; then
  say "Go $gover is too old: install Go 1.26 or newer."
  exit 1
fi

apt_updated=
apt_update() {
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
}

# The same search order as fence-pg/pgtemp.
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
  if command -v postgres >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v postgres)"; return 0
  fi
  return 1
}

if [ -n "${LEASEFENCE_PG_URL:-}" ]; then
  say "LEASEFENCE_PG_URL is set: tests use that external server; crash cases will skip."
elif bindir=$(find_pg_bindir); then
  say "PostgreSQL binaries: $bindir ($("$bindir/postgres" --version))"
else
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "PostgreSQL server binaries not found: installing them with apt-get (postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    apt_update
    apt-get install -y -qq postgresql >/dev/null
    bindir=$(find_pg_bindir) || { say "apt-get installed postgresql but no initdb/postgres was found"; exit 1; }
    say "PostgreSQL binaries: $bindir ($("$bindir/postgres" --version))"
  else
    say "PostgreSQL server binaries (initdb, postgres) not found. Install them, then retry:"
    say "  Debian/Ubuntu: sudo apt-get install -y postgresql"
    say "  Fedora/RHEL:   sudo dnf install -y postgresql-server"
    say "  macOS:         brew install postgresql@16"
    say "or set LEASEFENCE_PG_BINDIR to the directory holding initdb and postgres."
    exit 1
  fi
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  say "running as root: creating the unprivileged OS user 'postgres' (PostgreSQL refuses to run as root)"
  useradd --system --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
fi

# The same search order as fence-pg/tests/internal/pgbouncertest.
find_pgbouncer() {
  local p
  if [ -n "${LEASEFENCE_PGBOUNCER:-}" ]; then
    [ -x "$LEASEFENCE_PGBOUNCER" ] && { echo "$LEASEFENCE_PGBOUNCER"; return 0; }
    return 1
  fi
  if p=$(command -v pgbouncer 2>/dev/null); then echo "$p"; return 0; fi
  for p in /usr/sbin/pgbouncer /usr/local/sbin/pgbouncer /usr/local/bin/pgbouncer /opt/homebrew/bin/pgbouncer; do
    if [ -x "$p" ]; then echo "$p"; return 0; fi
  done
  return 1
}

# apt_install_no_service installs packages without letting their maintainer
# scripts start the packaged services (Debian's pgbouncer would start one on
# 127.0.0.1:6432): a policy-rc.d answering 101 ("action forbidden") for the
# duration of the install, unless one is already in place.
apt_install_no_service() {
  local policy=/usr/sbin/policy-rc.d created= rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# ensure-deps.sh: no service starts during this install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created=1
  fi
  apt-get install -y -qq "$@" >/dev/null || rc=$?
  if [ -n "$created" ]; then rm -f "$policy"; fi
  return "$rc"
}

# The same search as fence-pg/pgtemp's StartPatroni: the variable, else PATH,
# else /usr/bin, /usr/sbin, /usr/local/bin.
find_program() { # variable, program name
  local var=$1 name=$2 p
  if [ -n "${!var:-}" ]; then
    [ -x "${!var}" ] && { echo "${!var}"; return 0; }
    return 1
  fi
  if p=$(command -v "$name" 2>/dev/null); then echo "$p"; return 0; fi
  for p in /usr/bin/$name /usr/sbin/$name /usr/local/bin/$name; do
    if [ -x "$p" ]; then echo "$p"; return 0; fi
  done
  return 1
}

if [ -n "$want_patroni" ]; then
  if pat=$(find_program LEASEFENCE_PATRONI patroni) && etc=$(find_program LEASEFENCE_ETCD etcd); then
    say "Patroni: $pat ($("$pat" --version 2>&1 | head -n1)); etcd: $etc ($("$etc" --version 2>&1 | head -n1))"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "Patroni or etcd not found: installing them with apt-get (patroni etcd-server; their packaged services are not started, the tests run their own)"
    export DEBIAN_FRONTEND=noninteractive
    apt_update
    apt_install_no_service patroni etcd-server
    pat=$(find_program LEASEFENCE_PATRONI patroni) && etc=$(find_program LEASEFENCE_ETCD etcd) ||
      { say "apt-get installed patroni and etcd-server but the patroni or etcd program was not found"; exit 1; }
    say "Patroni: $pat ($("$pat" --version 2>&1 | head -n1)); etcd: $etc ($("$etc" --version 2>&1 | head -n1))"
  else
    say "Patroni (the patroni program) or etcd's server (the etcd program) not found; F16 on Patroni needs them. Install them, then retry:"
    say "  Debian/Ubuntu: sudo apt-get install -y patroni etcd-server   (the tests start their own processes; the packaged services need not run)"
    say "or set LEASEFENCE_PATRONI and LEASEFENCE_ETCD to the programs."
    exit 1
  fi
fi

if [ -z "$want_pgbouncer" ]; then
  exit 0
fi
if [ -n "${LEASEFENCE_PGBOUNCER:-}" ] && [ ! -x "$LEASEFENCE_PGBOUNCER" ]; then
  say "LEASEFENCE_PGBOUNCER=$LEASEFENCE_PGBOUNCER is not an executable file: point it at the pgbouncer program, or unset it."
  exit 1
elif pgb=$(find_pgbouncer); then
  say "PgBouncer: $pgb ($("$pgb" --version 2>&1 | head -n1))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "PgBouncer not found: installing it with apt-get (pgbouncer; its packaged service is not started, the tests run their own)"
  export DEBIAN_FRONTEND=noninteractive
  apt_update
  apt_install_no_service pgbouncer
  pgb=$(find_pgbouncer) || { say "apt-get installed pgbouncer but no pgbouncer program was found"; exit 1; }
  say "PgBouncer: $pgb ($("$pgb" --version 2>&1 | head -n1))"
else
  say "PgBouncer (the pgbouncer program, 1.18 or newer) not found; the tests behind a transaction pooler need it. Install it, then retry:"
  say "  Debian/Ubuntu: sudo apt-get install -y pgbouncer   (the tests start their own process; the packaged service need not run)"
  say "  Fedora/RHEL:   sudo dnf install -y pgbouncer"
  say "  macOS:         brew install pgbouncer"
  say "or set LEASEFENCE_PGBOUNCER to the pgbouncer program."
  exit 1
fi
