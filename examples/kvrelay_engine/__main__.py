"""Prefill/decode disaggregation through kvrelay, token for token.

    python3 -m kvrelay_engine [--model gqa|mla] [--prefill-tp N] [--decode-tp N]
                              [--protocol ipc|tcp|rdma] [--dtype bfloat16|float16|fp8]
                              [--requests N] [--seed N] [--plant BUG] [--run-timeout S]

Runs a small model (model.py: Llama-style GQA; mla.py: DeepSeek-style
latent attention) twice with the same weights and prompts:

1. the oracle: the model in this process, TP 1, float64, its KV cache local
   tensors of the instance's dtype, no kvrelay;
2. disaggregated: a prefill instance and a decode instance, each of TP rank
   processes whose KV cache is its kvrelay pool (seen in place), with
   kvrelay moving every request's KV layer by layer while the prefill
   computes; chunked prefill, the decode side's prefix cache sending only the
   rest, some decode halves only after their prefill ended.

Each request's generated tokens must be the oracle's, every decode step's
logits within 1e-3 of the oracle's, and what each decode rank
received the oracle's KV to the cache dtype's rounding. The last line says
`engine: N of M requests match the oracle`; the exit status is 0 only when
N = M. --plant damages what decode rank 0 received for the first request
(drop-block, swap-heads, zero-request): the run must then fail, naming the
request, the layer and the rank.

Needs python3-torch (CPU, gloo), kvrelay's Python module on PYTHONPATH, and
kvrelay-coordinator (--bin-dir, KVRELAY_BIN_DIR or PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import hosts
from .mla import MlaConfig
from .model import Config
from .schedule import make_requests, plan

BLOCK_SIZE = 16
NUM_BLOCKS = 512
HOST_BLOCKS = 64  # --swap: the decode instance's host tier
# Every decode step's logits against the oracle's: both are float64
# computations of the same KV (bit-identical where kvrelay moved it right),
# differing only in how TP ranks split the sums (~1e-12) and, rarely, a KV
# value rounded to the other neighbouring bfloat16 (one step, ~0.4%, of one
# value moves a logit by ~1e-4 here; for fp8 that needs a float64 near-tie
# at one of 2^-3-spaced points, ~1e-13 likely per value). A transfer bug
# moves them by > 0.1.
LOGITS_TOLERANCE = 1e-3


def logits_problems(got, want) -> list[str]:
    """Every decode step's logits against the oracle's: the first step that
    differs by more than LOGITS_TOLERANCE, if one does."""
    if got.shape != want.shape:
        return [f"{got.shape[0]} decode steps' logits, the oracle has {want.shape[0]}"]
    diff = abs(got - want).max(-1)  # numpy arrays, [decode steps, vocab]
    over = (diff > LOGITS_TOLERANCE).nonzero()[0]
    if len(over) == 0:
        return []
    step = int(over[0])
    return [f"decode step {step}'s logits differ by up to {float(diff[step]):.3g} "
            f"(tolerance {LOGITS_TOLERANCE:g}; {len(over)} of {len(diff)} steps over it)"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coordinator_binary(bin_dir: str) -> str:
    for candidate in (Path(bin_dir) / "kvrelay-coordinator" if bin_dir else None,
                      shutil.which("kvrelay-coordinator")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    sys.exit("kvrelay_engine: kvrelay-coordinator not found (give --bin-dir or put it on PATH)")


def start_instance(binary: str, name: str, role: str, cfg, tp: int, run_timeout_s: float,
                   extra: list[str], netns: str = "") -> subprocess.Popen:
    return subprocess.Popen([
        *hosts.TwoHosts.exec_prefix(netns), binary, "--instance", name, "--role", role, "--tp-size", str(tp),
        "--num-layers", str(cfg.layers), "--num-blocks", str(NUM_BLOCKS),
        "--block-size", str(BLOCK_SIZE), *cfg.kvrelay_flags(tp), "--dtype", cfg.cache_dtype,
        "--request-deadline-ms", str(int(run_timeout_s * 1000)), "--log-level", "warn", *extra])


def stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def run_ranks(ctx, target, tp: int, args: tuple, netns: str = "") -> list:
    """The instance's TP rank processes (in network namespace `netns`, where
    their instance is): target(rank, tp, gloo port, *args)."""
    port = free_port()
    procs = [ctx.Process(target=hosts.run_in, args=(netns, target, rank, tp, port) + args)
             for rank in range(tp)]
    for p in procs:
        p.start()
    return procs


def collect(results, procs: list, want: int, timeout: float) -> list:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(got)} of {want} results")
        try:
            got.append(results.get(timeout=0.2))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a rank exited with {dead[0].exitcode}")
    return got


def run_disaggregated(args, cfg, the_plan, binary: str, tag: str, two, expected):
    """Both instances and both engines' rank processes, until every result
    is in: (the results, the instances' exit codes, the time it took)."""
    from . import engine

    prefill_name, decode_name = f"{tag}-p", f"{tag}-d"
    route = {"protocol": args.protocol, "decode_instance": decode_name}
    # ipc: one device id per prefill rank (at equal TP, rank r sends to decode
    # rank r; at unequal TP the head layouts decide, and these are ignored).
    route["device_ids"] = list(range(args.prefill_tp))
    decode_extra, prefill_extra = ["--protocol", "ipc"], ["--protocol", "ipc"]
    key_dir = tempfile.TemporaryDirectory(prefix="kvrelay-engine-key-")
    if args.protocol in ("tcp", "rdma"):  # both instances share a fresh key
        key = Path(key_dir.name) / "key"
        key.write_bytes(secrets.token_bytes(32))
        key.chmod(0o600)
    if args.protocol == "tcp":
        ports = [free_port() for _ in range(args.decode_tp)]
        address = hosts.DECODE_ADDRESS if two else "127.0.0.1"
        decode_extra = ["--protocol", "ipc,tcp", "--tcp-ports", ",".join(map(str, ports)),
                        "--listen-address", address, "--auth-key-file", str(key)]
        prefill_extra = ["--protocol", "ipc,tcp", "--auth-key-file", str(key)]
        route.update(address=address, tcp_ports=ports)
    if args.protocol == "rdma":  # the control connection on loopback, the writes on the RDMA device
        ports = [free_port() for _ in range(args.decode_tp)]
        rdma = ["--auth-key-file", str(key), "--rdma-gid-index", str(args.rdma_gid_index),
                # soft-RoCE in an emulated guest: a second of silence is slowness
                "--peer-timeout-ms", "5000"]
        decode_extra = ["--protocol", "ipc,rdma", "--rdma-ports", ",".join(map(str, ports)),
                        "--listen-address", "127.0.0.1", *rdma]
        prefill_extra = ["--protocol", "ipc,rdma", *rdma]
        route.update(address="127.0.0.1", rdma_ports=ports)
    prefill_ns, decode_ns = (two.prefill, two.decode) if two else ("", "")
    if args.swap:
        decode_extra += ["--num-host-blocks", str(HOST_BLOCKS)]
    decode_inst = start_instance(binary, decode_name, "decode", cfg, args.decode_tp,
                                 args.run_timeout, decode_extra, decode_ns)
    prefill_inst = start_instance(binary, prefill_name, "prefill", cfg, args.prefill_tp,
                                  args.run_timeout, prefill_extra, prefill_ns)
    ctx = mp.get_context("spawn")
    results, dests, first_tokens = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = []
    n = len(the_plan.requests)
    try:
        t1 = time.monotonic()
        procs += run_ranks(ctx, engine.decode_rank, args.decode_tp,
                           (cfg, the_plan, decode_name, prefill_name, dests, first_tokens, results,
                            expected, args.run_timeout, args.plant), decode_ns)
        procs += run_ranks(ctx, engine.prefill_rank, args.prefill_tp,
                           (cfg, the_plan, prefill_name, route, dests, first_tokens, results,
                            args.adapter), prefill_ns)
        got = collect(results, procs, 2 * n + 1 + n * args.decode_tp + (1 if args.swap else 0),
                      args.run_timeout)
        for p in procs:
            p.join(60)
        t_dis = time.monotonic() - t1
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        codes = [stop(prefill_inst), stop(decode_inst)]
        key_dir.cleanup()

    return got, codes, t_dis


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 2**32 / 1000:  # kvrelay's deadlines are 32-bit milliseconds
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds in (0, 4294967)")
    return seconds


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m kvrelay_engine",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["gqa", "mla"], default="gqa",
                    help="gqa: Llama-style grouped-query attention (K and V pools); mla: "
                         "DeepSeek-style latent attention (K-only pools, the latent on every rank)")
    ap.add_argument("--prefill-tp", type=int, default=2)
    ap.add_argument("--decode-tp", type=int, default=2)
    ap.add_argument("--protocol", choices=["ipc", "tcp", "rdma"], default="ipc",
                    help="tcp: the decode instance listens on loopback ports, with a fresh key; "
                         "rdma: the same for its control connections, the KV written over the "
                         "first RDMA device (e.g. inside tools/rxe-vm)")
    ap.add_argument("--rdma-gid-index", type=int, default=1,
                    help="rdma: the instances' RoCE GID index")
    ap.add_argument("--adapter", action="store_true",
                    help="ipc: the prefill engine talks to kvrelay through the FastDeploy-shaped "
                         "CacheInfoAdapter (cache_info dictionaries, the original's kv signal, "
                         "get_finished_req), as an engine written against the original would")
    ap.add_argument("--swap", action="store_true",
                    help="the decode side's prefix cache evicts a prefix to its host tier and a "
                         "later request loads it back layer by layer, its forward waiting on "
                         "each layer")
    ap.add_argument("--two-hosts", action="store_true",
                    help="tcp: the prefill side (instance and ranks) in one network namespace, "
                         "the decode side in another, joined by a veth pair (198.18.214.0/24), "
                         "as two servers; needs root and iproute2")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "fp8"], default="bfloat16",
                    help="the KV cache's dtype, stored in the pools; fp8: e4m3 bytes with a "
                         "float32 scale per token and head (kvrelay's K/V scale tensors)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--chunk-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--bin-dir", default=os.environ.get("KVRELAY_BIN_DIR", ""))
    ap.add_argument("--run-timeout", type=positive_seconds, default=300.0,
                    help="seconds the disaggregated run may take, and so every request's deadline "
                         "in both instances (--request-deadline-ms): the decode scheduler declares "
                         "every request before the first prefill step, so the last one's arrival "
                         "waits for the whole prefill run; an engine that declares a request when "
                         "it schedules it keeps kvrelay's default minute")
    ap.add_argument("--plant", choices=["drop-block", "swap-heads", "zero-request", "lose-swap"],
                    default="",
                    help="damage what decode rank 0 received for the first request (lose-swap, "
                         "with --swap: what its host tier holds for the swap-in): the run must "
                         "fail, naming the request, layer and rank")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    try:
        from . import engine  # torch
    except ImportError as e:
        print(f"kvrelay_engine: skipped: {e} (tools/setup.sh installs python3-torch)")
        return 77
    cfg = (MlaConfig(cache_dtype=args.dtype) if args.model == "mla"
           else Config(cache_dtype=args.dtype))
    requests = make_requests(args.seed, args.requests, cfg.vocab, BLOCK_SIZE, args.gen_tokens)
    the_plan = plan(requests, BLOCK_SIZE, args.slots, args.chunk_tokens, NUM_BLOCKS, args.swap)

    t0 = time.monotonic()
    answers, expected = engine.oracle(cfg, the_plan, NUM_BLOCKS)
    t_oracle = time.monotonic() - t0

    binary = coordinator_binary(args.bin_dir)
    if args.two_hosts:
        if args.protocol != "tcp":
            sys.exit("kvrelay_engine: --two-hosts needs --protocol tcp")
        why = hosts.unavailable()
        if why:
            print(f"kvrelay_engine: skipped: --two-hosts: {why}")
            return 77
    if args.plant == "lose-swap" and not args.swap:
        sys.exit("kvrelay_engine: --plant lose-swap needs --swap")
    if args.adapter and args.protocol != "ipc":
        sys.exit("kvrelay_engine: --adapter takes the original's ipc peers (--protocol ipc)")
    tag = f"engine-{os.getpid()}"
    with (hosts.TwoHosts(tag) if args.two_hosts else contextlib.nullcontext()) as two:
        got, codes, t_dis = run_disaggregated(args, cfg, the_plan, binary, tag, two, expected)
        over_veth = two.decode_received_bytes() if two else 0
    n = len(requests)

    completions = {g[1]: g for g in got if g[0] == "prefill"}
    decoded = {g[1]: g for g in got if g[0] == "decode"}
    received: dict[str, list[str]] = {}
    for g in got:
        if g[0] == "received" and g[3]:
            received.setdefault(g[1], []).append(g[3])
    layer_ns = next(g[1] for g in got if g[0] == "layer_ns")
    swap_result = next((g for g in got if g[0] == "swap"), None)

    if args.model == "mla":
        print(f"model: DeepSeek-style MLA, {cfg.layers} layers, {cfg.heads} heads, a latent of "
              f"{cfg.kv_lora_rank} + {cfg.rope_dim} RoPE values on every rank")
    else:
        print(f"model: Llama-style GQA, {cfg.layers} layers, {cfg.heads} query heads over "
              f"{cfg.kv_heads} KV heads, head_dim {cfg.head_dim}")
    print(f"kvrelay: prefill TP {args.prefill_tp} -> decode TP {args.decode_tp} over "
          f"{args.protocol}{' between two network namespaces' if args.two_hosts else ''}, "
          f"{cfg.cache_dtype} cache{', through the FastDeploy-shaped adapter' if args.adapter else ''}, {len(the_plan.steps)} prefill steps of up "
          f"to {args.slots} slots x {args.chunk_tokens} tokens"
          f"{', planted bug: ' + args.plant if args.plant else ''}")
    matching = 0
    waits = []
    for r, req in enumerate(requests):
        problems = []
        c = completions.get(req.id)
        if c is None or c[2] != "finished":
            problems.append(f"prefill side: {c[2] + ': ' + c[3] if c else 'no completion'}")
        d = decoded.get(req.id)
        want = answers[req.id]
        if d is None:
            problems.append("never decoded")
        else:
            if d[2] != want.tokens:
                problems.append(f"tokens {d[2]}, oracle {want.tokens}")
            problems += logits_problems(d[3], want.logits.numpy())
            if not the_plan.late_dest[r]:  # a late half waits for its decode half by design
                waits.append(d[4])
        problems += received.get(req.id, [])
        swapped = the_plan.swap is not None and the_plan.swap.request == r
        if swapped and (swap_result is None or not swap_result[2]):
            problems.append(f"its swap-in: {swap_result[3] if swap_result else 'no completion'}")
        hit = len(the_plan.src_tables[r]) - len(the_plan.sent_blocks[r])
        state = "match" if not problems else "MISMATCH"
        print(f"  {req.id}: {state}, prompt {len(req.prompt)} tokens, prefix hit {hit} blocks"
              f"{', late decode half' if the_plan.late_dest[r] else ''}"
              + (f", its prefix evicted to the host tier and loaded back" if swapped else "")
              + "".join(f"\n      {p}" for p in problems))
        matching += not problems
    if waits:
        waits.sort()
        print(f"decode side: prefill's last layer -> arrived p50 {waits[len(waits) // 2] / 1e6:.2f} ms "
              f"(one layer's forward: {layer_ns / 1e6:.2f} ms); oracle {t_oracle:.1f} s, "
              f"disaggregated {t_dis:.1f} s")
    if swap_result is not None:
        sw = the_plan.swap
        print(f"swap: {the_plan.requests[sw.request].id}'s prefix ({len(sw.blocks)} blocks) evicted "
              f"to the decode host tier and loaded back layer by layer; its first forward waited "
              f"up to {swap_result[4] / 1e6:.2f} ms for a layer")
    moved = sum(c[4] for c in completions.values())  # (the adapter's statuses carry no count)
    if not args.adapter:
        print(f"kvrelay moved {moved / 2**20:.2f} MiB of KV cache"
              + (f"; the decode host's link received {over_veth / 2**20:.2f} MiB"
                 if args.two_hosts else ""))
    if args.two_hosts and over_veth < moved:
        print("the decode host received less than kvrelay moved: the KV did not cross the link")
        matching = min(matching, n - 1)
    if any(code != 0 for code in codes):
        print(f"instances exited {codes}")
        matching = min(matching, n - 1)
    print(f"engine: {matching} of {n} requests match the oracle")
    return 0 if matching == n else 1


if __name__ == "__main__":
    sys.exit(main())
