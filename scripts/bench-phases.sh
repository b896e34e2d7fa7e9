#!/usr/bin/env bash
# Where tito's time goes in the peers bench's 1-concurrent cell, phase by
# phase (src/phases.rs): builds tito with the `phase-timing` feature as
# target/release/tito-phases (the plain release binary is left as it was),
# loads it alone with benches/peers.rs at 1 concurrent, and prints the
# median of each phase per window of 4,000 requests (the first window holds
# the warm-up). TITO_PEERS_SECS sets the seconds measured (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

scripts/bench-peers.sh --setup-only
cargo build --release --bin tito --features phase-timing
cp target/release/tito target/release/tito-phases
# The plain binary back: copied from cargo's artifacts when they match the
# source, else built (as scripts/bench-peers.sh would).
cargo build --release --bin tito
out=$(mktemp)
trap 'rm -f "$out"' EXIT
TITO_PHASES_FILE="$out" TITO_BIN="$PWD/target/release/tito-phases" TITO_PEERS_ONLY=tito \
  TITO_PEERS_CONC=1 TITO_PEERS_ROUNDS=1 TITO_PEERS_SECS="${TITO_PEERS_SECS:-10}" \
  cargo bench --bench peers
echo
cat "$out"
