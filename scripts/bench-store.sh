#!/usr/bin/env bash
# The span store bench (benches/store.rs) on SQLite and on a throwaway
# PostgreSQL cluster on loopback (scripts/postgres.sh), stopped by PID at the
# end. Extra arguments go to criterion (e.g. a filter: `store_ingest`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
pg_dir=$(mktemp -d /tmp/tito-pg-bench.XXXXXX)
trap 'scripts/postgres.sh stop "$pg_dir"; rm -rf "$pg_dir"' EXIT
TITO_BENCH_POSTGRES=$(scripts/postgres.sh start "$pg_dir")
export TITO_BENCH_POSTGRES
echo "postgres at $TITO_BENCH_POSTGRES ($("$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/postgres" --version))"
cargo bench --bench store -- "$@"
