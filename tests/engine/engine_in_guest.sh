#!/usr/bin/env bash
# Runs inside tools/rxe-vm: the example engine (examples/kvrelay_engine)
# with its KV cache moved over the rdma transport on soft-RoCE; every
# request's tokens must be the oracle's. TP 1 -> 1 keeps the emulated guest
# to a handful of processes (each layer's forward takes ~1.5 s under TCG).
#   engine_in_guest.sh <kvrelay python module dir> <examples dir> <bin dir>
set -euo pipefail
export PYTHONPATH=$1:$2
# --run-timeout: the disaggregated run took 114 s in the guest on an idle
# 2-core host, more on a loaded CI machine; the default 300 s is for hosts.
out=$(/usr/bin/python3 -m kvrelay_engine --bin-dir "$3" --protocol rdma --prefill-tp 1 \
  --decode-tp 1 --run-timeout 600 2>&1) || { code=$?; echo "$out"; exit $code; }
echo "$out"
last=$(echo "$out" | tail -1)
[[ $last =~ ^engine:\ ([0-9]+)\ of\ ([0-9]+)\ requests\ match\ the\ oracle$ ]] &&
  [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && [ "${BASH_REMATCH[2]}" -ge 8 ] ||
  { echo "engine_in_guest: unexpected last line: $last" >&2; exit 1; }
