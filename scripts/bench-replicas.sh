#!/usr/bin/env bash
# One tito replica against two behind docker/nginx.conf, on a throwaway
# PostgreSQL cluster (scripts/postgres.sh, stopped by PID at the end) and a
# mock backend (benches/replicas.rs). Needs Debian's postgresql and nginx
# (scripts/setup-system.sh --test installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
scripts/fetch-tokenizers.sh
pg_dir=$(mktemp -d /tmp/tito-pg-bench.XXXXXX)
trap 'scripts/postgres.sh stop "$pg_dir"; rm -rf "$pg_dir"' EXIT
TITO_BENCH_POSTGRES=$(scripts/postgres.sh start "$pg_dir")
export TITO_BENCH_POSTGRES
cargo build --release --bin tito
cargo bench --bench replicas
