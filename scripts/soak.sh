#!/usr/bin/env bash
# Soak: N concurrent agents run multi-turn tool-calling trajectories against
# a release `tito serve` (SQLite store in a temp dir) in front of mock vLLM
# backends for M minutes. Reports the gateway's RSS at start, after warm-up
# (the first 10% of the run) and at the end, latency p50/p99, errors by
# status and throughput, then exports the store and checks that every
# acknowledged call is in it (0 lost, 0 extra, the same sampled tokens, one
# sample per trajectory). Exits non-zero when a call is lost or extra, a
# trajectory differs or split, or on any 5xx or transport error. The driver is
# examples/soak/; figures and how to read them: docs/reliability.md.
#
#   scripts/soak.sh [--agents N] [--minutes M] [--turns T] [--backends B]
#                   [--config-extra TOML] [--keep]
#
# Defaults: 200 agents, 30 minutes, 8 turns, 2 mock backends, tito's default
# configuration. --config-extra appends TOML to the generated config.toml
# (e.g. $'[trajectory]\nretry_window_s = 10'). --keep leaves the temp dir
# (config, logs, store) in place; it is also kept on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

agents=200
minutes=30
turns=8
backends=2
keep=0
extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) agents="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --turns) turns="$2"; shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    --config-extra) extra="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

[ -f .cache/tokenizers/qwen3/tokenizer.json ] || scripts/fetch-tokenizers.sh
cargo build --release --quiet --bin tito --example soak
bin="${CARGO_TARGET_DIR:-target}/release"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/tito-soak.XXXXXX")"
pids=()     # the servers this script started
drains=()   # the `cat`s copying their output to logs (end with it)
status=1
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}" "${drains[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$keep" = 1 ] || [ "$status" != 0 ]; then
    echo "soak: logs, config and store kept in $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT

# start NAME REGEX CMD...: runs CMD with its output in $tmp/NAME.log, reads
# the address its first lines print (REGEX's group 1) into $addr and its PID
# into $pid.
start() {
  local name="$1" regex="$2" fifo="$tmp/$1.fifo" line fd
  shift 2
  mkfifo "$fifo"
  "$@" >"$fifo" 2>&1 &
  pid=$!
  pids+=("$pid")
  exec {fd}<"$fifo"
  addr=""
  while IFS= read -r -t 120 -u "$fd" line; do
    printf '%s\n' "$line" >>"$tmp/$name.log"
    if [[ "$line" =~ $regex ]]; then addr="${BASH_REMATCH[1]}"; break; fi
  done
  if [ -z "$addr" ]; then
    exec {fd}<&-
    echo "soak: $name did not print its address:" >&2
    cat "$tmp/$name.log" >&2
    exit 1
  fi
  # Keep draining its output into the log.
  cat <&"$fd" >>"$tmp/$name.log" &
  drains+=("$!")
  exec {fd}<&-
}

backend_toml=""
for i in $(seq 1 "$backends"); do
  start "mock$i" 'listening on ([^ ]+)' "$bin/examples/soak" mock
  backend_toml+=$'[[backends]]\n'"url = \"http://$addr\""$'\nkind = "vllm"\n'
done

cat >"$tmp/config.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[model]
name = "soak-model"
tokenizer = "$PWD/.cache/tokenizers/qwen3"
tool_parser = "hermes"
$backend_toml
[store]
url = "sqlite://$tmp/spans.db"
$extra
EOF

export RUST_LOG="${RUST_LOG:-info}" NO_COLOR=1
start tito 'tito listening addr=([^ ]+)' "$bin/tito" serve --config "$tmp/config.toml"
tito_pid="$pid"
echo "soak: tito $addr (pid $tito_pid), $backends mock backend(s), work dir $tmp"

set +e
"$bin/examples/soak" drive --url "http://$addr" --pid "$tito_pid" \
  --agents "$agents" --minutes "$minutes" --turns "$turns" \
  --db "$tmp/spans.db" --log "$tmp/tito.log"
status=$?
set -e
exit "$status"
