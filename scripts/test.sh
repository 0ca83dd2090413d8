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
#   6. the HTTP gateway's tests.
# Usage: bash scripts/test.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

setup_all

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets -q -- -D warnings

log "unit tests, and the client's and test provider's tests (real clusters of their own)"
cargo test -q -p pg_intent_id -p pg_intent_client -p pg_intent_test_provider

start_cluster
bash "$ROOT/scripts/regress.sh"
stop_cluster

log "the memory-checking pass (valgrind memcheck on the server)"
bash "$ROOT/scripts/valgrind.sh"

log "integration tests (real clusters, real concurrent connections)"
cargo test -q -p pg_intent_tests -- --test-threads=1

log "HTTP gateway tests (real HTTP, real cluster)"
cargo test -q -p pg_intent_gateway

log "all tests passed"
