#!/usr/bin/env bash
# What a running tito's histograms recorded over a window: scrapes URL/metrics
# twice, SECS (default 10) apart, and prints for each histogram series the
# samples between the scrapes, their mean, and how many fell in each bucket.
# Run it beside a bench, e.g. during the 1-concurrent cell of
# `TITO_PEERS_ONLY=tito cargo bench --bench peers`, with the URL of the tito
# the bench started (`ss -ltnp | grep tito`). Histogram samples reach
# /metrics in batches every few seconds, so use windows of 10 s or more.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 URL [SECS]" >&2; exit 2; }
url=${1%/}
secs=${2:-10}
before=$(mktemp)
after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
curl -sf "$url/metrics" > "$before"
sleep "$secs"
curl -sf "$url/metrics" > "$after"
python3 - "$before" "$after" <<'PY'
import re
import sys


def read(path):
    values = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        values[series] = float(value)
    return values


a, b = read(sys.argv[1]), read(sys.argv[2])
for series in sorted(b):
    if not re.match(r"^\w+_sum(\{|$)", series):
        continue
    count = series.replace("_sum", "_count", 1)
    n = b.get(count, 0) - a.get(count, 0)
    if n <= 0:
        continue
    mean = (b[series] - a.get(series, 0)) / n
    print(f"{series.replace('_sum', '', 1)}: {n:.0f} samples, mean {mean * 1e6:.1f} us")
    name = series.split("{")[0].replace("_sum", "_bucket")
    labels = series[len(series.split("{")[0]):].strip("{}")
    for bucket in b:
        if not bucket.startswith(name + "{"):
            continue
        rest = bucket[len(name) + 1:-1]
        le = re.search(r'le="([^"]+)"', rest)
        others = re.sub(r',?le="[^"]+"', "", rest).strip(",")
        if le and others == labels:
            got = b[bucket] - a.get(bucket, 0)
            print(f"  <= {le.group(1)} s: {got:.0f}")
PY
