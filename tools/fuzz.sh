#!/usr/bin/env bash
# The long fuzz run, by hand: every libFuzzer target for SECONDS seconds each
# (default 1200), from the checked-in seed corpora, printing each target's
# execution count and findings. Builds the fuzz preset (clang) first.
#
#   tools/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-1200}
cmake --preset fuzz > /dev/null
cmake --build --preset fuzz > /dev/null  # the preset builds the fuzzers only
status=0
for target in decode_validate ring_consumer segment_header tcp_wire handshake ipc_landed rdma_endpoint; do
  work=$(mktemp -d)
  echo "== ${target}_fuzzer, ${seconds} s"
  if ./build/fuzz/bin/${target}_fuzzer -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/" "$work" "tests/fuzz/corpus/$target" 2> "$work/log"; then
    echo "findings: none"
  else
    echo "findings: see $work (crash inputs are the files named crash-* / leak-* / timeout-*)"
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|Done [0-9]+ runs" "$work/log" || true
done
exit $status
