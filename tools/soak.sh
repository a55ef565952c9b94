#!/usr/bin/env bash
# The long soak, run by hand: kvrelay-sim moves REQUESTS requests between two
# instances while a random worker is SIGKILLed every KILL_MS milliseconds,
# and prints the tally: requests, kills, completions by status, requests
# without exactly one completion (must be 0), hangs (must be 0) and byte
# errors in finished requests (must be 0). It fails too when fewer than one
# request in twenty finishes (kills so close together that no transfer
# survives them verify nothing), and when a worker is not serving again
# once the kills stop (a supervisor that gave a killed worker up).
#
#   tools/soak.sh [--build-dir DIR] [--prefill NAME] [--decode NAME] [REQUESTS] [KILL_MS]
#
# Defaults: build/release, instances soak-p and soak-d (suffixed with this
# shell's pid, so that two soaks never collide), 10000 requests, 3000 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build/release
prefill="soak-p-$$"
decode="soak-d-$$"
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    --*) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
requests=${1:-10000}
kill_ms=${2:-3000}
sim="$build_dir/bin/kvrelay-sim"
if [ ! -x "$sim" ]; then
  echo "soak.sh: $sim not found: build first (cmake --preset release && cmake --build --preset release), or pass --build-dir" >&2
  exit 2
fi
exec "$sim" --start --prefill "$prefill" --decode "$decode" --tp 2 --layers 16 \
  --blocks 512 --requests "$requests" --kill-every-ms "$kill_ms" \
  --min-finished $((requests / 20)) --layer-compute-us 500 --timeout-s 86400
