#!/usr/bin/env python3
"""The original's control path, rebuilt with Python's standard library only.

FastDeploy's cache messager receives cache tasks through EngineWorkerQueue, a
multiprocessing manager over TCP, and lines its ranks up with
manager-proxied threading.Barrier objects. Each rank's task thread loops:

    cache_info = engine_worker_queue.get_cache_info()      # a proxied call
    engine_worker_queue.finish_add_cache_task_barrier.wait()  # a proxied barrier
    if not cache_info: time.sleep(0.001)

This script rebuilds that, so that kvrelay's benchmarks can run the baseline
side by side with their own measurement:

    manager_baseline.py dispatch --samples 500
        time from the engine's put to a rank holding the task: one rank
        polling a manager queue every 1 ms (the original also waits on a
        proxied barrier after each poll; leaving it out makes the baseline
        faster, never slower)
    manager_baseline.py barrier --ranks 2 --rounds 2000
        one round of a manager-proxied threading.Barrier

Each prints one line: `p50_us=<x> p99_us=<y> mean_us=<z> samples=<n>`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import random
import statistics
import sys
import threading
import time
from multiprocessing.managers import BaseManager

AUTHKEY = b"kvrelay-bench"


class QueueManager(BaseManager):
    pass


def serve(ranks: int):
    tasks: queue.Queue = queue.Queue()
    barrier = threading.Barrier(ranks)
    QueueManager.register("tasks", callable=lambda: tasks)
    QueueManager.register("barrier", callable=lambda: barrier)
    manager = QueueManager(address=("127.0.0.1", 0), authkey=AUTHKEY)
    manager.start()
    return manager


def connect(address):
    QueueManager.register("tasks")
    QueueManager.register("barrier")
    m = QueueManager(address=address, authkey=AUTHKEY)
    m.connect()
    return m


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]


def report(samples_us: list[float]) -> None:
    print(
        f"p50_us={percentile(samples_us, 0.5):.1f} p99_us={percentile(samples_us, 0.99):.1f} "
        f"mean_us={statistics.fmean(samples_us):.1f} samples={len(samples_us)}"
    )


def dispatch_rank(address, samples: int, out) -> None:
    tasks = connect(address).tasks()
    latencies = []
    while len(latencies) < samples:
        try:
            info = tasks.get_nowait()
        except queue.Empty:
            time.sleep(0.001)
            continue
        latencies.append((time.perf_counter_ns() - info["submitted_ns"]) / 1e3)
    out.send(latencies)


def run_dispatch(samples: int) -> None:
    manager = serve(1)
    parent, child = mp.Pipe()
    rank = mp.Process(target=dispatch_rank, args=(manager.address, samples, child))
    rank.start()
    tasks = connect(manager.address).tasks()
    rng = random.Random(1)
    for i in range(samples):
        # Not phase-locked with the rank's 1 ms poll.
        time.sleep(rng.uniform(0.001, 0.003))
        tasks.put({"request_id": f"req-{i}", "src_block_ids": [1], "submitted_ns": time.perf_counter_ns()})
    latencies = parent.recv()
    rank.join()
    manager.shutdown()
    report(latencies)


def barrier_rank(address, rounds: int, out) -> None:
    barrier = connect(address).barrier()
    barrier.wait()  # everyone connected
    stamps = []
    for _ in range(rounds):
        barrier.wait()
        stamps.append(time.perf_counter_ns())
    if out is not None:
        out.send([(b - a) / 1e3 for a, b in zip(stamps, stamps[1:])])


def run_barrier(ranks: int, rounds: int) -> None:
    manager = serve(ranks)
    parent, child = mp.Pipe()
    procs = [
        mp.Process(target=barrier_rank, args=(manager.address, rounds, child if r == 0 else None))
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    rounds_us = parent.recv()
    for p in procs:
        p.join()
    manager.shutdown()
    report(rounds_us)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="case", required=True)
    d = sub.add_parser("dispatch", help="engine put -> a rank holds the task")
    d.add_argument("--samples", type=int, default=500)
    b = sub.add_parser("barrier", help="one round of a manager-proxied threading.Barrier")
    b.add_argument("--ranks", type=int, default=2)
    b.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    if args.case == "dispatch":
        run_dispatch(args.samples)
    else:
        run_barrier(args.ranks, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
