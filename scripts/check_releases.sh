#!/usr/bin/env bash
# Refuses an edit to a released script. A release's install script (sql/releases/) and the
# upgrade script that leads to it (sql/pg_intent--A--B.sql, B released) are what users'
# databases ran: changing one afterwards would give two databases "at 0.2.0" different
# catalogs, and ALTER EXTENSION UPDATE would never reach the change. Fix forward instead: a new
# version and an upgrade script to it.
#
# Checks:
#   1. sql/releases/SHA256SUMS lists every released script, and each matches its checksum;
#   2. with git history, each listed file is unchanged since the commit that released it (the
#      one that first listed it in SHA256SUMS);
#   3. every upgrade script whose target version is released is listed.
# And, called by scripts/lib.sh (install_extension) after cargo pgrx has generated the current
# version's install script: if that version is released, the generated script must hold
# exactly the released one's SQL. cargo pgrx orders independent blocks differently from one
# build to the next (and per major) and labels each with its source line, so the comparison
# is of the blocks as a set, without those labels.
#
# Usage: bash scripts/check_releases.sh                       check this tree
#        bash scripts/check_releases.sh self-test             show that an edit is refused
#        bash scripts/check_releases.sh generated FILE VERSION  compare a generated script
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

check() { # check DIR: the repository to check
  local dir="$1" sql="$1/sql" sums="$1/sql/releases/SHA256SUMS" f first status=0
  [ -f "$sums" ] || { echo "release check: $sums is missing" >&2; return 1; }
  (cd "$sql" && sha256sum --quiet -c releases/SHA256SUMS) >&2 || {
    echo "release check: a released script differs from sql/releases/SHA256SUMS (released scripts are never edited: add a new version and an upgrade script)" >&2
    return 1
  }
  for f in "$sql"/releases/pg_intent--*.sql; do
    grep -q " releases/$(basename "$f")\$" "$sums" || { echo "release check: $f is not listed in SHA256SUMS" >&2; status=1; }
  done
  for f in "$sql"/pg_intent--*--*.sql; do
    local to="${f##*--}"; to="${to%.sql}"
    if [ -f "$sql/releases/pg_intent--$to.sql" ]; then
      grep -q " $(basename "$f")\$" "$sums" || { echo "release check: $f leads to released $to but is not listed in SHA256SUMS" >&2; status=1; }
    fi
  done
  if git -C "$dir" rev-parse --git-dir >/dev/null 2>&1 && [ "$(git -C "$dir" rev-parse --is-shallow-repository)" = false ]; then
    while read -r _ f; do
      # Released by the commit that first listed it in SHA256SUMS.
      first="$(git -C "$dir" log --format=%H -S "  $f" -- sql/releases/SHA256SUMS | tail -n 1)"
      [ -n "$first" ] || continue # released by the change being checked
      if ! git -C "$dir" show "$first:sql/$f" | cmp -s - "$sql/$f"; then
        echo "release check: sql/$f was changed after its release in $first (released scripts are never edited)" >&2
        status=1
      fi
    done <"$sums"
  else
    echo "release check: no full git history here; checked against SHA256SUMS only" >&2
  fi
  return "$status"
}

same_sql() { # same_sql A B: the same blocks of SQL, in any order, source labels aside
  python3 - "$1" "$2" <<'PY'
import re, sys
def blocks(path):
    text = open(path).read()
    parts = re.split(r"^/\* <begin connected objects> \*/$", text, flags=re.M)
    return sorted("\n".join(l for l in p.splitlines() if not re.match(r"^-- \S+\.rs:\d+$", l)).strip()
                  for p in parts if p.strip())
a, b = blocks(sys.argv[1]), blocks(sys.argv[2])
if a != b:
    only_a = [x for x in a if x not in b]
    only_b = [x for x in b if x not in a]
    for x in only_a[:3]: print("released only:\n" + x[:600] + "\n", file=sys.stderr)
    for x in only_b[:3]: print("generated only:\n" + x[:600] + "\n", file=sys.stderr)
    sys.exit(1)
PY
}

if [ "${1:-}" = generated ]; then
  released="$ROOT/sql/releases/pg_intent--$3.sql"
  [ -f "$released" ] || exit 0 # not released yet: nothing to compare with
  same_sql "$released" "$2" || {
    echo "release check: the code generates another install script for $3 than the one released ($released): give the change a new version and an upgrade script" >&2
    exit 1
  }
  exit 0
fi

if [ "${1:-}" = self-test ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  git clone -q "$ROOT" "$tmp/repo"
  (cd "$tmp/repo" && git -c user.name=t -c user.email=t@t checkout -q -b edit)
  # Edit a released script and its checksum together: only the history can tell.
  f="$(awk 'NR == 1 { print $2 }' "$tmp/repo/sql/releases/SHA256SUMS")"
  echo "-- an edit" >>"$tmp/repo/sql/$f"
  (cd "$tmp/repo/sql" && sed -i "s|^[0-9a-f]*  $f\$|$(sha256sum "$f" | cut -d' ' -f1)  $f|" releases/SHA256SUMS)
  (cd "$tmp/repo" && git -c user.name=t -c user.email=t@t commit -q -am "edit a released script")
  if check "$tmp/repo" 2>"$tmp/err"; then
    echo "release check self-test FAILED: an edit to $f was accepted" >&2
    exit 1
  fi
  grep -q "changed after its release" "$tmp/err" || { cat "$tmp/err" >&2; echo "release check self-test FAILED: wrong reason" >&2; exit 1; }
  # And the checksum alone catches an uncommitted edit.
  echo "-- another" >>"$tmp/repo/sql/$f"
  if check "$tmp/repo" 2>/dev/null; then echo "release check self-test FAILED: checksum" >&2; exit 1; fi
  echo "release check self-test: edits to released scripts are refused"
  exit 0
fi

check "$ROOT"
echo "release check: released scripts unchanged"
