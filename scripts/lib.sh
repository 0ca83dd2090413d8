#!/usr/bin/env bash
# Shared by every script: versions from pgrx.toml, idempotent installs, throwaway clusters.
# Source it; it defines functions and never changes anything by itself.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

pin() { # pin SECTION KEY -> value from pgrx.toml
  awk -v s="[$1]" -v k="$2" '
    /^\[/ { in_s = ($0 == s) }
    in_s && $1 == k { gsub(/"/, "", $3); print $3; exit }' "$ROOT/pgrx.toml"
}
PGRX_VERSION="$(pin pgrx version)"
PG_MAJOR="$(pin postgres major)"
PG_CONFIG="/usr/lib/postgresql/$PG_MAJOR/bin/pg_config"
[ -x "$PG_CONFIG" ] || PG_CONFIG="/usr/bin/pg_config"
PG_BIN="/usr/lib/postgresql/$PG_MAJOR/bin"
PGXS_TEST="/usr/lib/postgresql/$PG_MAJOR/lib/pgxs/src/test"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: the server, its headers (pgrx bindgen, pg_regress, pg_isolation_regress),
# clang for bindgen, sudo because cargo-pgrx shells out to it, pg_cron for the schedules of
# docs/scheduling.md (tests/tests/scheduling.rs), valgrind for the memory-checking pass
# (scripts/valgrind.sh).
install_packages() {
  local want=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-$PG_MAJOR-cron libclang-dev clang sudo valgrind)
  local missing=()
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    # Always name the whole set: installing the headers alone could leave the server at an
    # older minor version than the headers the extension is built against.
    log "installing Debian packages (missing: ${missing[*]})"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q "${want[@]}"
  fi
  # The Debian package starts a cluster of its own on 5432; we never use it.
  [ -x "$PG_BIN/initdb" ] || die "initdb not found in $PG_BIN"
}

install_cargo_pgrx() {
  if cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then return; fi
  log "installing cargo-pgrx $PGRX_VERSION (takes several minutes, once)"
  cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked
}

pgrx_init() {
  if [ -f "${PGRX_HOME:-$HOME/.pgrx}/config.toml" ] && grep -q "pg$PG_MAJOR" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    return
  fi
  log "cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"
  cargo pgrx init "--pg$PG_MAJOR" "$PG_CONFIG"
}

# Builds the extension and installs it where the system server looks.
install_extension() {
  log "building and installing the pg_intent extension (release)"
  (cd "$ROOT/extension" && as_root env "PATH=$PATH" "CARGO_TARGET_DIR=$CARGO_TARGET_DIR" "HOME=$HOME" \
     cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null)
  # The install scripts of earlier releases, exactly as released (cargo pgrx generates the
  # current one and copies the upgrade scripts): CREATE EXTENSION pg_intent VERSION '0.1.0'
  # followed by ALTER EXTENSION pg_intent UPDATE is how the upgrade tests start.
  as_root cp "$ROOT"/sql/releases/pg_intent--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
}

setup_all() {
  install_packages
  install_cargo_pgrx
  pgrx_init
  install_extension
}

# --- throwaway clusters -------------------------------------------------------------------
# PostgreSQL refuses to run as root, so when we are root the cluster belongs to `postgres`.

run_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_cluster: sets CLUSTER_DIR, PGHOST, PGPORT, PGUSER; stop_cluster removes everything.
start_cluster() {
  CLUSTER_DIR="$(mktemp -d /tmp/pg_intent.XXXXXX)"
  chmod 755 "$CLUSTER_DIR"
  [ "$(id -u)" = 0 ] && chown postgres: "$CLUSTER_DIR"
  PGPORT="$(free_port)"
  run_pg "$PG_BIN/initdb" -D "$CLUSTER_DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$CLUSTER_DIR/initdb.log" 2>&1 \
    || { cat "$CLUSTER_DIR/initdb.log"; die "initdb failed"; }
  run_pg "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR/data" -l "$CLUSTER_DIR/server.log" -w \
    -o "-p $PGPORT -k $CLUSTER_DIR -c listen_addresses=127.0.0.1 -c fsync=on ${CLUSTER_OPTS:-}" start >/dev/null \
    || { cat "$CLUSTER_DIR/server.log"; die "the server did not start"; }
  export PGHOST="$CLUSTER_DIR" PGPORT PGUSER=postgres PGDATABASE=postgres CLUSTER_DIR
  trap stop_cluster EXIT
  log "throwaway cluster on port $PGPORT (socket and data in $CLUSTER_DIR)"
}

stop_cluster() {
  [ -n "${CLUSTER_DIR:-}" ] || return 0
  run_pg "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$CLUSTER_DIR"
  CLUSTER_DIR=""
}
