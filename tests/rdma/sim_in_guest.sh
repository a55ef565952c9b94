#!/usr/bin/env bash
# Runs inside tools/rxe-vm: the whole system over the rdma transport on
# soft-RoCE, with real coordinator and worker processes.
#   1. Every request declared on the decode side (--expect-arrivals): each
#      must finish, arrive there exactly once, and verify byte for byte.
#   2. A soak that SIGKILLs a random worker every 700 ms: every request gets
#      exactly one completion, failures name the killed rank, no finished
#      request has a wrong byte, nothing hangs.
#   3. An MLA latent cache (K only, replicated) at unequal TP.
#   4. Long prompts: 128k-token requests in 16-token blocks (8,192 blocks in
#      a layer), declared and byte-verified; and kvrelay-bench-rdma moving
#      64 MiB of scattered 16 KiB blocks (a long backlog of granted writes:
#      both once failed with "rdma session lost", then a crash on exit).
#   sim_in_guest.sh <kvrelay-sim> [<kvrelay-bench-rdma>]
set -euo pipefail
sim=$1
bench=${2:-}
# The guest is emulated (TCG) and shares the host's cores with other tests,
# and soft-RoCE moves every byte in the guest's kernel, on the CPUs the
# heartbeats need: with the host's two cores busy elsewhere, a sender's
# heartbeats were seen to stop for 0.8-0.9 s while its writes drained, which
# the default peer timeout (1 s; 0.8 s of silence) takes for a hang. A
# second of silence there is slowness, not a dead peer, so every step runs
# with 5 s. Killed workers are still noticed at once (their sockets close,
# their pidfds fire).
common=(--start --protocol rdma --tp 2 --layers 4 --blocks 64 --block-size 16 --head-dim 64
        --min-tokens 16 --max-tokens 200 --log-level error --peer-timeout-ms 5000)
echo "== rdma: expected requests, byte-verified"
"$sim" "${common[@]}" --requests 24 --layer-compute-us 2000 --prefill rdma-ep --decode rdma-ed \
  --expect-arrivals 2>&1 | grep -v 'requests, .* MiB moved$' || exit 1
echo "== rdma: heterogeneous TP, prefill tp 2 into decode tp 4, byte-verified head by head"
"$sim" "${common[@]}" --decode-tp 4 --total-kv-heads 4 --requests 16 --layer-compute-us 2000 \
  --prefill rdma-hp --decode rdma-hd --expect-arrivals 2>&1 | grep -v 'requests, .* MiB moved$' || exit 1
echo "== rdma: an MLA latent cache (K only, one head on every rank), tp 2 into tp 4, fp8 with scales"
"$sim" "${common[@]}" --mla --dtype fp8 --decode-tp 4 --requests 16 --layer-compute-us 2000 \
  --prefill rdma-mp --decode rdma-md --expect-arrivals 2>&1 | grep -v 'requests, .* MiB moved$' || exit 1
echo "== rdma: soak, a worker SIGKILLed every 700 ms"
"$sim" "${common[@]}" --requests 200 --layer-compute-us 1000 --prefill rdma-kp --decode rdma-kd \
  --kill-every-ms 700 2>&1 | grep -v 'requests, .* MiB moved$' || exit 1
echo "== rdma: long prompts, 128k tokens in 16-token blocks, byte-verified"
"$sim" --start --protocol rdma --tp 1 --layers 4 --blocks 8200 --block-size 16 --head-dim 64 \
  --min-tokens 131072 --max-tokens 131072 --chunk-tokens 8192 --requests 2 --layer-compute-us 1000 \
  --log-level error --peer-timeout-ms 5000 --prefill rdma-lp --decode rdma-ld --expect-arrivals \
  2>&1 | grep -v 'requests, .* MiB moved$' || exit 1
if [ -n "$bench" ]; then
  echo "== rdma: a 64 MiB backlog of scattered 16 KiB blocks (kvrelay-bench-rdma)"
  "$bench" --mib 64 --block-kib 16 --peer-timeout-ms 5000 || exit 1
fi
