#!/usr/bin/env bash
# The long soak, run by hand: kvrelay-sim moves REQUESTS requests (default
# 10000) between two instances while a random worker is SIGKILLed every
# KILL_MS milliseconds (default 3000), and prints the tally: requests, kills,
# completions by status, requests without exactly one completion (must be 0),
# hangs (must be 0) and byte errors in finished requests (must be 0).
#
#   tools/soak.sh [REQUESTS] [KILL_MS]      (after building the release preset)
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-10000}
kill_ms=${2:-3000}
exec ./build/release/bin/kvrelay-sim --start --prefill soak-p --decode soak-d --tp 2 --layers 16 \
  --blocks 512 --requests "$requests" --kill-every-ms "$kill_ms" --layer-compute-us 500 \
  --timeout-s 86400
