#!/usr/bin/env python3
"""Prefill/decode disaggregation through kvrelay, token for token.

Runs a small Llama-style model (model.py) twice with the same weights, the
same prompts and the same chunked-prefill schedule:

1. the reference: one instance of TP ranks that prefills and decodes with a
   local KV cache;
2. disaggregated: a prefill instance and a decode instance, each of TP rank
   processes whose KV cache is its kvrelay pool (seen in place), with
   kvrelay moving every request's KV layer by layer while the prefill
   computes, the decode side's prefix cache sending only the rest.

Every request's generated tokens must be the reference's, exactly, and
every request must get exactly one completion on each side.

    run.py [--requests N] [--gen-tokens N] [--tp N] [--bin-dir DIR]

Exit status 0 when every token matches. Needs python3-torch (CPU, gloo) and
the kvrelay Python module on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mla import MlaConfig  # noqa: E402
from model import Config  # noqa: E402
from schedule import make_requests, plan  # noqa: E402

BLOCK_SIZE = 16
NUM_BLOCKS = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coordinator_binary(bin_dir: str) -> str:
    for candidate in (Path(bin_dir) / "kvrelay-coordinator" if bin_dir else None,
                      shutil.which("kvrelay-coordinator")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    sys.exit("run.py: kvrelay-coordinator not found (give --bin-dir or put it on PATH)")


def start_instance(binary: str, name: str, role: str, cfg, tp: int) -> subprocess.Popen:
    return subprocess.Popen([
        binary, "--instance", name, "--role", role, "--tp-size", str(tp),
        "--num-layers", str(cfg.layers), "--num-blocks", str(NUM_BLOCKS),
        "--block-size", str(BLOCK_SIZE), *cfg.kvrelay_flags(tp),
        "--dtype", "bfloat16", "--protocol", "ipc", "--log-level", "warn"])


def stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def run_ranks(ctx, target, tp: int, args: tuple) -> list:
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, tp, port) + args) for rank in range(tp)]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["gqa", "mla"], default="gqa",
                    help="gqa: Llama-style grouped-query attention (K and V pools); mla: "
                         "DeepSeek-style latent attention (K-only pools, the latent on every rank)")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--chunk-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--bin-dir", default=os.environ.get("KVRELAY_BIN_DIR", ""))
    ap.add_argument("--corrupt", action="store_true",
                    help="negative control: zero the V that request 0 received before decoding it; "
                         "the run must then report a mismatch (exit 1)")
    args = ap.parse_args()

    try:
        import engine  # torch, after the arguments
    except ImportError as e:
        print(f"run.py: skipped: {e} (tools/setup.sh installs python3-torch)")
        return 77

    cfg = MlaConfig() if args.model == "mla" else Config()
    requests = make_requests(args.seed, args.requests, cfg.vocab, BLOCK_SIZE, args.gen_tokens)
    the_plan = plan(requests, BLOCK_SIZE, args.slots, args.chunk_tokens, NUM_BLOCKS)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()

    t0 = time.monotonic()
    ref = run_ranks(ctx, engine.reference_rank, args.tp, (cfg, the_plan, NUM_BLOCKS, results))
    reference = {rid: tokens for _, rid, tokens in collect(results, ref, len(requests), 300)}
    for p in ref:
        p.join(60)
    t_ref = time.monotonic() - t0

    binary = coordinator_binary(args.bin_dir)
    tag = f"engine-{os.getpid()}"
    prefill_name, decode_name = f"{tag}-p", f"{tag}-d"
    decode_inst = start_instance(binary, decode_name, "decode", cfg, args.tp)
    prefill_inst = start_instance(binary, prefill_name, "prefill", cfg, args.tp)
    dests, first_tokens = ctx.Queue(), ctx.Queue()
    procs = []
    try:
        t1 = time.monotonic()
        procs += run_ranks(ctx, engine.decode_rank, args.tp,
                           (cfg, the_plan, decode_name, prefill_name, dests, first_tokens, results,
                            args.corrupt))
        procs += run_ranks(ctx, engine.prefill_rank, args.tp,
                           (cfg, the_plan, prefill_name, decode_name, dests, first_tokens, results))
        got = collect(results, procs, 2 * len(requests), 300)
        for p in procs:
            p.join(60)
        t_dis = time.monotonic() - t1
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        codes = [stop(prefill_inst), stop(decode_inst)]

    completions = [g for g in got if g[0] == "prefill"]
    decoded = {g[1]: g[2] for g in got if g[0] == "decode"}
    failures = []
    ids = [r.id for r in requests]
    if sorted(c[1] for c in completions) != sorted(ids):
        failures.append(f"prefill completions {sorted(c[1] for c in completions)}, want one per request")
    for _, rid, status, message, _ in completions:
        if status != "finished":
            failures.append(f"{rid}: prefill side {status}: {message}")
    moved = sum(c[4] for c in completions)
    sent_blocks = sum(len(b) for b in the_plan.sent_blocks)
    all_blocks = sum(len(t) for t in the_plan.src_tables)
    for r in requests:
        if decoded.get(r.id) != reference[r.id]:
            failures.append(f"{r.id}: decoded {decoded.get(r.id)}, reference {reference[r.id]}")
    if any(code != 0 for code in codes):
        failures.append(f"instances exited {codes}")

    if args.model == "mla":
        print(f"model: DeepSeek-style MLA, {cfg.layers} layers, {cfg.heads} heads, a latent of "
              f"{cfg.kv_lora_rank} + {cfg.rope_dim} RoPE values cached on every rank, vocab "
              f"{cfg.vocab}, TP {args.tp}")
    else:
        print(f"model: Llama-style GQA, {cfg.layers} layers, {cfg.heads} query heads over "
              f"{cfg.kv_heads} KV heads, head_dim {cfg.head_dim}, vocab {cfg.vocab}, TP {args.tp}")
    print(f"requests: {len(requests)} (prompts {min(len(r.prompt) for r in requests)}.."
          f"{max(len(r.prompt) for r in requests)} tokens, {args.gen_tokens} generated each), "
          f"{len(the_plan.steps)} prefill steps of up to {args.slots} slots x {args.chunk_tokens} tokens")
    print(f"prefix cache: {all_blocks - sent_blocks} of {all_blocks} prompt blocks already on the "
          f"decode side; {sent_blocks} sent, {moved} bytes moved")
    print(f"reference {t_ref:.1f} s, disaggregated {t_dis:.1f} s")
    if failures:
        for f in failures:
            print(f"MISMATCH {f}")
        return 1
    print(f"tokens: all {len(requests)} requests match the reference token for token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
