#!/usr/bin/env bash
# Builds the Debian package of pg_intent for one or every supported major:
#   target/packages/postgresql-<major>-pg-intent_<version>_amd64.deb
# It holds what `cargo pgrx install` builds for that major (the library, the control file, the
# install scripts of every release and the upgrade scripts between them), laid out where
# Debian's (and PGDG's) postgresql-<major> looks: /usr/lib/postgresql/<major>/lib and
# /usr/share/postgresql/<major>/extension. It depends on postgresql-<major> and on the glibc
# the library was linked against.
#
# Usage: bash scripts/package.sh [--installed] [MAJOR...]   (default: every major of pgrx.toml;
#                                             --installed: package what is installed, no build)
#        bash scripts/package.sh test         build the default major's package, install it with
#                                             apt-get on this machine, CREATE EXTENSION on a
#                                             throwaway cluster, remove it, and put the
#                                             development build back
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

VERSION="$(awk -F'"' '/^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")"
OUT="$CARGO_TARGET_DIR/packages"

build_deb() { # build_deb MAJOR: expects the extension installed for MAJOR (install_extension)
  local major="$1" pkg stage lib share glibc deb
  use_major "$major"
  pkg="postgresql-$major-pg-intent"
  stage="$(mktemp -d)"
  lib="$stage/usr/lib/postgresql/$major/lib"
  share="$stage/usr/share/postgresql/$major/extension"
  mkdir -p "$lib" "$share" "$stage/DEBIAN" "$stage/usr/share/doc/$pkg"
  install -m 0644 "$("$PG_CONFIG" --pkglibdir)/pg_intent.so" "$lib/"
  install -m 0644 "$("$PG_CONFIG" --sharedir)"/extension/pg_intent.control "$share/"
  install -m 0644 "$("$PG_CONFIG" --sharedir)"/extension/pg_intent--*.sql "$share/"
  [ -f "$share/pg_intent--$VERSION.sql" ] || die "no install script of $VERSION for PostgreSQL $major: run install_extension first"
  install -m 0644 "$ROOT/README.md" "$stage/usr/share/doc/$pkg/README.md"
  install -m 0644 "$ROOT/docs/operations.md" "$stage/usr/share/doc/$pkg/operations.md"
  # The newest glibc symbol version the library needs.
  glibc="$(objdump -T "$lib/pg_intent.so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)"
  cat >"$stage/DEBIAN/control" <<CONTROL
Package: $pkg
Version: $VERSION
Architecture: amd64
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Maintainer: pg_intent developers <pg-intent@invalid>
Depends: postgresql-$major, libc6 (>= $glibc), libgcc-s1
Section: database
Priority: optional
Description: durable jobs and attempts that make retries and fallbacks safe
 pg_intent turns every retry and fallback into a new attempt under one durable
 job, keyed by (owner_id, idempotency_key), and enforces inside PostgreSQL
 $major: one job per intent, no new attempt while the last outcome is unknown,
 exactly one winning result. CREATE EXTENSION pg_intent in a database to use it.
CONTROL
  mkdir -p "$OUT"
  deb="$OUT/${pkg}_${VERSION}_amd64.deb"
  dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
  rm -rf "$stage"
  log "built $deb"
  echo "$deb"
}

if [ "${1:-}" = test ]; then
  use_major "$DEFAULT_MAJOR"
  deb="$(build_deb "$DEFAULT_MAJOR")"
  # Read whole before matching: `cmd | grep -q` fails under pipefail when grep exits first and
  # cmd then dies of SIGPIPE, which depends on timing.
  info="$(dpkg-deb --info "$deb")"
  grep -q "Depends: postgresql-$DEFAULT_MAJOR," <<<"$info" || die "the package does not depend on postgresql-$DEFAULT_MAJOR"
  log "apt-get install $deb"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q "$deb" >/dev/null
  [[ "$(dpkg-query -W -f='${Status}' "postgresql-$DEFAULT_MAJOR-pg-intent")" == *"install ok installed"* ]] || die "the package is not installed"
  start_cluster
  out="$("$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -c "CREATE EXTENSION pg_intent" \
    -c "SELECT (intent.submit_job('deb', 'k1', 'p', '{}')).created" \
    -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'")" \
    || die "CREATE EXTENSION from the package failed"
  grep -q "$VERSION" <<<"$out" || die "the package installed another version than $VERSION"
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -c "DROP EXTENSION pg_intent"
  stop_cluster
  log "apt-get remove postgresql-$DEFAULT_MAJOR-pg-intent"
  DEBIAN_FRONTEND=noninteractive as_root apt-get remove -y -q "postgresql-$DEFAULT_MAJOR-pg-intent" >/dev/null
  [ ! -e "/usr/lib/postgresql/$DEFAULT_MAJOR/lib/pg_intent.so" ] || die "removing the package left the library behind"
  [ ! -e "/usr/share/postgresql/$DEFAULT_MAJOR/extension/pg_intent.control" ] || die "removing the package left the control file behind"
  log "the package installs, creates the extension and removes cleanly; putting the development build back"
  install_extension
  exit 0
fi

build=1
if [ "${1:-}" = --installed ]; then build=0; shift; fi
majors=("$@")
[ ${#majors[@]} -gt 0 ] || read -r -a majors <<<"$PG_MAJORS"
if [ "$build" = 1 ]; then
  install_packages
  install_cargo_pgrx
  for m in "${majors[@]}"; do [ "$m" = "$DEFAULT_MAJOR" ] || install_wheel "$m"; done
  pgrx_init
fi
for m in "${majors[@]}"; do
  use_major "$m"
  [ "$build" = 0 ] || install_extension
  build_deb "$m" >/dev/null
done
