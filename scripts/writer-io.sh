#!/usr/bin/env bash
# Bytes the SQLite store writes per second (WAL frames from its writer
# thread, copies into the database from its checkpoint thread: the two
# threads' `wchar` in /proc, summed), for each tito PID given, one line per
# second until a process exits or SECS (default 60) pass.
# Run it beside a bench, e.g. `cargo bench --bench peers`, and divide a
# steady second's KiB by the cell's req/s for the bytes written per call.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 PID [PID...]" >&2; exit 2; }
secs=${SECS:-60}
declare -A tids last
for p in "$@"; do
  for d in /proc/"$p"/task/*; do
    case "$(cat "$d/comm")" in
      tito-store-writ|tito-store-chec) tids[$p]="${tids[$p]:-} $(basename "$d")" ;;
    esac
  done
  [ -n "${tids[$p]:-}" ] || { echo "no store writer thread in $p (not a SQLite store?)" >&2; exit 1; }
done
for _ in $(seq 1 "$secs"); do
  line=$(date +%T)
  for p in "$@"; do
    v=0
    for t in ${tids[$p]}; do
      w=$(awk '/^wchar/{print $2}' "/proc/$p/task/$t/io" 2>/dev/null) || exit 0
      v=$(( v + w ))
    done
    d=$(( v - ${last[$p]:-$v} ))
    last[$p]=$v
    line="$line $p: $(( d / 1024 )) KiB/s"
  done
  echo "$line"
  sleep 1
done
