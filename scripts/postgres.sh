#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on loopback for the tests and benches.
#   scripts/postgres.sh start DIR   initdb into DIR, start on a free port,
#                                   print the base URL (postgres://tito@127.0.0.1:PORT)
#   scripts/postgres.sh stop DIR    stop the server by the PID it wrote
# The server binaries come from Debian's postgresql package
# (scripts/setup-system.sh --test installs it). As root, the cluster runs as
# the package's `postgres` user: initdb refuses root.
set -euo pipefail
cmd="${1:?start|stop}"
dir="${2:?directory}"

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bindir/initdb" ] || { echo "postgres.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
  mkdir -p "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  as_owner "$bindir/initdb" -D "$dir/data" -U tito -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null \
    || { cat "$dir/server.log" >&2; exit 1; }
  echo "postgres://tito@127.0.0.1:$port"
  ;;
stop)
  pidfile="$dir/data/postmaster.pid"
  [ -f "$pidfile" ] || exit 0
  pid=$(head -1 "$pidfile")
  # SIGINT: PostgreSQL's fast shutdown.
  kill -INT "$pid" 2>/dev/null || exit 0
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
