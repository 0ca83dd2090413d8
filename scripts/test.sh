#!/usr/bin/env bash
# Runs every test of pg_intent on a fresh machine: installs what is missing (Debian packages,
# cargo-pgrx, `cargo pgrx init`), builds and installs the extension, then runs
#   1. formatting and lints,
#   2. the Rust unit tests,
#   3. the pg_regress and isolation suites against a throwaway cluster,
#   4. the same suites and a large-value corpus with the server under valgrind memcheck,
#   5. the integration tests (they start and kill clusters of their own): the protocol,
#      concurrency, crashes, hostile input, the host-database suite, the threat model,
#      interrupts, large values, upgrades,
#   6. the HTTP gateway's tests, then the four failure points from Python (psycopg) and Node.js
#      (node-postgres) over the SQL API alone, as an ordinary intent_app role (lang_tests.sh),
#   7. on every other supported major (pgrx.toml: 16, 17, 18): the build, pg_regress, isolation,
#      the four failure points, the host-database suite and the security tests,
#   8. the major-version upgrade (pg_upgrade from 15 to 18) and the Debian package;
# and, between 5 and 6, the conformance suite (scripts/conformance.sh: one list of suites —
# pg_regress and isolation, the model check, the four failure points in Rust, Python and
# Node.js, host database, security, threat model, a short storm — run against a target chosen by
# PG_INTENT_TARGET, tests/README.md § Targets) on the targets the full run does not cover:
#   native-distributed  one node with intent.force_distributed_statements=on, always;
#   citus               a coordinator and two workers (each database distributed), with the
#                       distributed mode's own tests (tests/tests/citus.rs), where Citus is
#                       built once from the vendored source (or PG_INTENT_CITUS_BIN names a
#                       server with it), else skipped, saying so.
# (native, the default target, is what steps 3-6 run.)
# Usage: bash scripts/test.sh          everything
#        bash scripts/test.sh majors   only steps 7 and 8 (after a full run)
#        bash scripts/test.sh upgrade  only step 8
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

only="${1:-all}"
# Steps 3-6 run on the native target; the conformance runs below name theirs.
unset PG_INTENT_TARGET
case "$only" in all | majors | upgrade) ;; *) die "usage: $0 [majors|upgrade]" ;; esac

check_disk
install_packages
install_majors
setup_all

# The suites every major runs (the default one runs them within the full suite).
MAJOR_TESTS=(double_click same_key_different_input timeout reverse_order_finish host_database private_schemas claim_order security threat_model)

other_majors() {
  local m
  for m in $PG_MAJORS; do
    [ "$m" = "$DEFAULT_MAJOR" ] && continue
    log "PostgreSQL $m: build, pg_regress, isolation, failure points, host database, security"
    use_major "$m"
    install_extension
    start_cluster
    bash "$ROOT/scripts/regress.sh"
    stop_cluster
    cargo test -q -p pg_intent_tests $(printf -- '--test %s ' "${MAJOR_TESTS[@]}") -- --test-threads=1
  done
  use_major "$DEFAULT_MAJOR"
}

# The distributed mode on a real Citus cluster (tests/tests/citus.rs: a coordinator and two
# workers on loopback). Citus comes from ../shared/vendor, built once into the default major's
# server (lib.sh: install_citus), or from PG_INTENT_CITUS_BIN: the bin directory of a
# PostgreSQL of the default major whose library directory has citus.so. This build of pg_intent
# is copied into it first, as major_upgrade does (one build serves every minor of a major).
citus() {
  if [ -z "${PG_INTENT_CITUS_BIN:-}" ]; then
    PG_INTENT_CITUS_BIN="$(install_citus)"
  fi
  if [ -z "${PG_INTENT_CITUS_BIN:-}" ]; then
    log "the distributed mode (Citus): skipped: no Citus source in $VENDOR_DIR (citus-$CITUS_VERSION.tar.gz) and no PG_INTENT_CITUS_BIN (set it to <bin directory of a PostgreSQL $DEFAULT_MAJOR whose lib directory has citus.so>)"
    return
  fi
  local cfg="$PG_INTENT_CITUS_BIN/pg_config"
  [ -x "$cfg" ] || die "PG_INTENT_CITUS_BIN=$PG_INTENT_CITUS_BIN: no pg_config there"
  [ -f "$("$cfg" --pkglibdir)/citus.so" ] || die "PG_INTENT_CITUS_BIN=$PG_INTENT_CITUS_BIN: no citus.so in $("$cfg" --pkglibdir)"
  [[ "$("$cfg" --version)" == "PostgreSQL $DEFAULT_MAJOR."* ]] || die "PG_INTENT_CITUS_BIN: not PostgreSQL $DEFAULT_MAJOR"
  if [ "$("$cfg" --pkglibdir)" != "$("$PG_CONFIG" --pkglibdir)" ]; then
    as_root cp "$("$PG_CONFIG" --pkglibdir)/pg_intent.so" "$("$cfg" --pkglibdir)/"
    as_root cp "$("$PG_CONFIG" --sharedir)"/extension/pg_intent* "$("$cfg" --sharedir)/extension/"
  fi
  log "the distributed mode on a real Citus cluster ($("$cfg" --version), 1 coordinator + 2 workers on loopback)"
  PG_INTENT_CITUS_BIN="$PG_INTENT_CITUS_BIN" cargo test -q -p pg_intent_tests --test citus -- --test-threads=2
  log "the conformance suite on target citus"
  PG_INTENT_CITUS_BIN="$PG_INTENT_CITUS_BIN" bash "$ROOT/scripts/conformance.sh" citus
}

# pg_upgrade from the default major to pgrx.toml's upgrade_to, with a job in every state
# (tests/tests/pg_upgrade.rs), then the four failure points on the upgraded cluster.
major_upgrade() {
  local from_dir from_bin to_bin keep spec
  to_bin="$(pg_prefix_bin "$UPGRADE_TO_MAJOR")"
  # From PyPI's stock build of the default major (pgrx.toml says why not Debian's), with the
  # extension built for the default major: a minor release keeps the ABI, so one build
  # serves every 15.x, as one Debian package does.
  install_wheel "$DEFAULT_MAJOR" "pg${DEFAULT_MAJOR}_upgrade_from"
  from_dir="$MAJORS_DIR/pg${DEFAULT_MAJOR}_upgrade_from"
  from_bin="$from_dir/bin"
  as_root cp "$("$PG_CONFIG" --pkglibdir)/pg_intent.so" "$("$from_bin/pg_config" --pkglibdir)/"
  as_root cp "$("$PG_CONFIG" --sharedir)"/extension/pg_intent* "$("$from_bin/pg_config" --sharedir)/extension/"
  log "pg_upgrade $("$from_bin/pg_config" --version) → $("$to_bin/pg_config" --version), then the four failure points on the upgraded cluster"
  keep="$(mktemp)"
  PG_INTENT_PG_BIN="$from_bin" PG_INTENT_UPGRADE_TO_BIN="$to_bin" PG_INTENT_KEEP_UPGRADED="$keep" \
    cargo test -q -p pg_intent_tests --test pg_upgrade
  spec="$(cat "$keep")"
  rm -f "$keep"
  [ -n "$spec" ] || die "the pg_upgrade test left no upgraded cluster"
  local status=0
  PG_INTENT_TEST_CLUSTER="$spec" PG_INTENT_PG_BIN="$to_bin" \
    cargo test -q -p pg_intent_tests $(printf -- '--test %s ' "${MAJOR_TESTS[@]:0:4}") -- --test-threads=1 || status=$?
  run_pg "$to_bin/pg_ctl" -D "${spec%:*}/data$UPGRADE_TO_MAJOR" -m fast -w stop >/dev/null || true
  rm -rf "${spec%:*}"
  [ "$status" = 0 ] || die "the failure points failed on the upgraded cluster"
}

packages() {
  log "Debian packages for every major, and the PostgreSQL $DEFAULT_MAJOR one installed with apt-get"
  bash "$ROOT/scripts/package.sh" --installed
  bash "$ROOT/scripts/package.sh" test
}

if [ "$only" = upgrade ]; then
  major_upgrade
  packages
  log "the upgrade and the package passed"
  exit 0
fi

if [ "$only" = majors ]; then
  other_majors
  major_upgrade
  packages
  log "all majors passed"
  exit 0
fi

log "released scripts are never edited"
bash "$ROOT/scripts/check_releases.sh"
bash "$ROOT/scripts/check_releases.sh" self-test

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --features pg_intent_harness/local-tokenizer -q -- -D warnings

log "unit tests, and the client's, harness's and test provider's tests (real clusters of their own)"
cargo test -q -p pg_intent_protocol -p pg_intent_client -p pg_intent_harness -p pg_intent_test_provider --features pg_intent_harness/local-tokenizer

start_cluster
bash "$ROOT/scripts/regress.sh"
stop_cluster

# Every per-backend state attacked in parallel workers: the isolation specs again with each
# query run by a parallel worker and not the leader, in both storage modes' statements.
forced="force_parallel_mode"
[ "$PG_MAJOR" -ge 16 ] && forced="debug_parallel_query"
for statements in off on; do
  log "the isolation specs with every query in a parallel worker ($forced = on, parallel_leader_participation = off; distributed statements $statements)"
  CLUSTER_OPTS="-c $forced=on -c parallel_leader_participation=off -c intent.force_distributed_statements=$statements" \
    env -u PGHOST bash "$ROOT/scripts/regress.sh" isolation
done

log "the memory-checking pass (valgrind memcheck on the server)"
bash "$ROOT/scripts/valgrind.sh"

log "integration tests (real clusters, real concurrent connections)"
# (The Citus tests say they skipped here; citus, below, runs them on the Citus server.)
env -u PG_INTENT_CITUS_BIN cargo test -q -p pg_intent_tests -- --test-threads=1

log "the conformance suite on target native-distributed (the distributed mode's statements on one node)"
bash "$ROOT/scripts/conformance.sh" native-distributed

citus

log "HTTP gateway tests (real HTTP, real cluster)"
cargo test -q -p pg_intent_gateway

log "the four failure points from Python and Node.js (psycopg, node-postgres; SQL API only, an intent_app role)"
bash "$ROOT/scripts/lang_tests.sh"

other_majors
major_upgrade
packages

log "all tests passed"
