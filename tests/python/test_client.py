"""The kvrelay Python module end to end against real coordinator and worker
processes: byte-verified transfers and swaps, errors, threads and the GIL."""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import kvrelay
from conftest import BIN_DIR, BLOCK_TOKENS, HOST_BLOCKS, LAYERS, TP, Instance, unique

POISON = 0xEE


def pattern(seed: int, rank: int, layer: int, tensor: int, index: int, nbytes: int) -> np.ndarray:
    """The bytes block `index` of a request must hold, distinct per argument."""
    base = seed * 131 + rank * 71 + layer * 31 + tensor * 17 + index * 7 + 1
    return ((np.arange(nbytes, dtype=np.uint32) * 3 + base) & 0xFF).astype(np.uint8)


def view(pool: kvrelay.Pool, layer: int, tensor: int, block: int) -> np.ndarray:
    return np.frombuffer(pool.block(layer, tensor, block), dtype=np.uint8)


def fill(pool, seed, rank, blocks) -> None:
    for layer in range(LAYERS):
        for t in range(2):
            for i, b in enumerate(blocks):
                v = view(pool, layer, t, b)
                v[:] = pattern(seed, rank, layer, t, i, v.size)


def poison(pool, blocks, layers=range(LAYERS)) -> None:
    for layer in layers:
        for t in range(2):
            for b in blocks:
                view(pool, layer, t, b)[:] = POISON


def holds_pattern(pool, seed, rank, layer, blocks, first_index=0) -> bool:
    return all(
        np.array_equal(view(pool, layer, t, b),
                       pattern(seed, rank, layer, t, first_index + i, pool.block_bytes(t)))
        for t in range(2) for i, b in enumerate(blocks))


def is_poisoned(pool, layer, blocks) -> bool:
    return all((view(pool, layer, t, b) == POISON).all() for t in range(2) for b in blocks)


def wait_for(client: kvrelay.Client, request_id: str) -> kvrelay.Completion:
    c = client.wait(timeout=20)
    assert c.request_id == request_id, c
    return c


# ---------------------------------------------------------------- transfers


def test_transfer_moves_every_byte_layer_by_layer_and_skips_the_prefix_cached_blocks(pair, engine):
    prefill, decode = pair
    src = [engine.open_pool(r) for r in range(TP)]
    with kvrelay.Client(decode) as decode_client:
        dst = [decode_client.open_pool(r) for r in range(TP)]
    src_blocks = np.array([4, 5, 6, 40, 41], dtype=np.int64)  # numpy ids are fine
    dst_blocks = [10, 11, 12]  # shorter: the decode side holds the first two blocks
    tokens = 5 * BLOCK_TOKENS - 3
    for r in range(TP):
        fill(src[r], 1, r, src_blocks)
        poison(dst[r], dst_blocks)

    engine.submit_cache_dest("py-req-1", dst_blocks, protocol="ipc", peer_instance=decode,
                             device_ids=range(TP))
    engine.submit_cache_task("py-req-1", src_blocks, tokens, engine_slot=3)
    # Two chunks: the first covers three blocks; after it, exactly the blocks
    # beyond the prefix within the chunk (index 2) have arrived, layer by layer.
    first = 3 * BLOCK_TOKENS
    for r in range(TP):
        engine.push_batch(r, 10, [(3, 0, first, "py-req-1")])
        for layer in range(LAYERS):
            engine.push_layer_done(r, 10, layer)
    deadline = time.monotonic() + 20
    while not all(holds_pattern(dst[r], 1, r, LAYERS - 1, dst_blocks[:1], 2) for r in range(TP)):
        assert time.monotonic() < deadline, "the first chunk did not arrive"
        time.sleep(0.002)
    assert engine.poll() is None, "the request must not finish after its first chunk"
    for r in range(TP):
        for layer in range(LAYERS):
            assert holds_pattern(dst[r], 1, r, layer, dst_blocks[:1], 2)
            assert is_poisoned(dst[r], layer, dst_blocks[1:])

    for r in range(TP):
        engine.push_batch(r, 11, np.array([[3, first, tokens - first]]))  # no tag: also fine
        for layer in range(LAYERS):
            engine.push_layer_done(r, 11, layer)
    c = wait_for(engine, "py-req-1")
    assert c.ok and c.status == "finished" and c.kind == "cache", c
    assert c.error_rank is None
    assert c.bytes_moved == TP * LAYERS * 2 * 3 * src[0].block_bytes("k")
    assert c.latency_s > 0
    for r in range(TP):
        for layer in range(LAYERS):
            assert holds_pattern(dst[r], 1, r, layer, dst_blocks, 2)


def test_legacy_per_query_mode(pair, engine):
    prefill, decode = pair
    src = [engine.open_pool(r) for r in range(TP)]
    with kvrelay.Client(decode) as d:
        dst = [d.open_pool(r) for r in range(TP)]
    for r in range(TP):
        fill(src[r], 2, r, [20, 21])
        poison(dst[r], [30, 31])
    engine.submit_cache_task("py-legacy", [20, 21], 2 * BLOCK_TOKENS, legacy_prefill_step=500)
    engine.submit_cache_dest("py-legacy", [30, 31], peer_instance=decode, device_ids=[0, 1])
    for r in range(TP):
        engine.push_legacy_layer_done(r, 500, LAYERS - 1)
    assert wait_for(engine, "py-legacy").ok
    for r in range(TP):
        for layer in range(LAYERS):
            assert holds_pattern(dst[r], 2, r, layer, [30, 31])


def test_a_refusing_decode_side_fails_the_request_with_its_text(pair, engine):
    engine.submit_cache_dest("py-refused", [1], peer_instance=pair[1], device_ids=[0, 1],
                             error_message="decode is out of blocks")
    c = wait_for(engine, "py-refused")
    assert c.status == "error" and "decode is out of blocks" in c.message


# ---------------------------------------------------------------- swap


def test_evict_then_load_layer_by_layer_while_another_thread_waits_on_each_layer(engine):
    device = [engine.open_pool(r) for r in range(TP)]
    host = [engine.open_pool(r, host_tier=True) for r in range(TP)]
    assert host[0].num_blocks == HOST_BLOCKS
    dev_blocks, host_blocks = [7, 8, 9, 50], [0, 1, 2, 31]
    for r in range(TP):
        fill(device[r], 3, r, dev_blocks)
    engine.submit_swap("py-evict", "evict", dev_blocks, host_blocks)
    c = wait_for(engine, "py-evict")
    assert c.ok and c.kind == "swap", c
    for r in range(TP):
        for layer in range(LAYERS):
            assert holds_pattern(host[r], 3, r, layer, host_blocks)
        poison(device[r], dev_blocks)

    seen_layers, failures = [], []

    def forward_pass():  # waits on each layer in turn, as a model would
        try:
            for layer in range(LAYERS):
                engine.wait_layer("py-load", layer, timeout=20)
                if not all(holds_pattern(device[r], 3, r, layer, dev_blocks) for r in range(TP)):
                    failures.append(f"layer {layer} was announced before its bytes arrived")
                seen_layers.append(layer)
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    forward = threading.Thread(target=forward_pass)
    forward.start()
    engine.submit_swap("py-load", "load", dev_blocks, host_blocks)
    c = wait_for(engine, "py-load")
    forward.join(timeout=30)
    assert not forward.is_alive()
    assert failures == []
    assert seen_layers == list(range(LAYERS))
    assert c.ok, c
    with pytest.raises(kvrelay.InvalidArgument):
        engine.wait_layer("py-load", LAYERS + 2, timeout=1)
    engine.wait_layer("py-load", 0, rank=1, timeout=1)


def test_wait_layer_of_a_load_nobody_submitted_times_out(engine):
    with pytest.raises(kvrelay.Timeout):
        engine.wait_layer("py-no-such-load", 0, timeout=0.05)


# ---------------------------------------------------------------- other tasks


def test_connect_cancel_and_register_pool_each_get_one_completion(pair, engine):
    engine.connect(7, protocol="ipc", peer_instance=pair[1])
    c = wait_for(engine, "connect-7")
    assert c.kind == "connect" and c.ok, c

    engine.cancel("py-never-submitted")
    c = wait_for(engine, "py-never-submitted")
    assert c.status == "rejected" and c.message

    engine.register_pool(0, "py-no-such-segment")
    c = engine.wait(timeout=20)
    assert c.kind == "register_pool" and not c.ok and "py-no-such-segment" in c.message


def test_an_expected_request_names_its_sender_and_shares_a_nonce(pair):
    nonce = kvrelay.Client.random_nonce()
    assert nonce != 0 and nonce != kvrelay.Client.random_nonce()
    with kvrelay.Client(pair[1]) as decode:
        with pytest.raises(kvrelay.InvalidArgument, match="from_instance"):
            decode.expect_arrival("py-scoped", [1, 2], from_instance="no/such")
        decode.expect_arrival("py-scoped", [1, 2], deadline_ms=200, from_instance=pair[0],
                              request_nonce=nonce)
        c = wait_for(decode, "py-scoped")
        assert c.kind == "arrived" and c.status == "timeout", c


def test_completions_iterates_until_quiet(pair, engine):
    for i in range(3):
        engine.cancel(f"py-iter-{i}")
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        got += [c.request_id for c in engine.completions(timeout=0.2)]
    assert got == ["py-iter-0", "py-iter-1", "py-iter-2"]
    assert list(engine.completions(timeout=0)) == []
    assert engine.poll() is None


# ---------------------------------------------------------------- errors


def test_bad_input_raises_at_once_with_a_message_and_submits_nothing(pair, engine):
    with pytest.raises(kvrelay.InvalidArgument, match=r"src_block_ids\[1\] = -1"):
        engine.submit_cache_task("py-bad", [1, -1], 16, engine_slot=0)
    with pytest.raises(TypeError, match=r"src_block_ids\[0\] is a float"):
        engine.submit_cache_task("py-bad", [1.5], 16, engine_slot=0)
    with pytest.raises(TypeError, match="src_block_ids must be"):
        engine.submit_cache_task("py-bad", "123", 16, engine_slot=0)
    with pytest.raises(kvrelay.InvalidArgument, match="out of range"):
        engine.submit_cache_task("py-bad", np.array([2**32]), 16, engine_slot=0)
    with pytest.raises(kvrelay.InvalidArgument, match="device_ids"):
        engine.submit_cache_dest("py-bad", [1], peer_instance=pair[1], device_ids=[0])
    with pytest.raises(kvrelay.InvalidArgument, match="carrier"):
        engine.submit_cache_dest("py-bad", [1], protocol="carrier pigeon")
    with pytest.raises(kvrelay.InvalidArgument, match="sideways"):
        engine.submit_swap("py-bad", "sideways", [1], [1])
    with pytest.raises(kvrelay.InvalidArgument, match="to the decode instance"):
        engine.expect_arrival("py-bad", [1, 2])  # declared to the decode instance only
    with pytest.raises(kvrelay.InvalidArgument, match="rank 5"):
        engine.push_layer_done(5, 0, 0)
    with pytest.raises(kvrelay.InvalidArgument, match=r"slots\[0\] has 2 items"):
        engine.push_batch(0, 0, [(1, 2)])
    with pytest.raises(kvrelay.InvalidArgument, match="waits forever"):
        engine.wait(timeout=-1)
    with pytest.raises(kvrelay.InvalidArgument, match="waits forever"):
        engine.wait(timeout=float("inf"))
    with pytest.raises(kvrelay.Timeout):
        engine.wait(timeout=0)
    assert engine.poll() is None  # nothing was submitted by any of the above


def test_exceptions_are_also_the_builtins_callers_catch():
    assert issubclass(kvrelay.InvalidArgument, ValueError)
    assert issubclass(kvrelay.Timeout, TimeoutError)
    assert issubclass(kvrelay.CoordinatorGone, ConnectionError)
    assert issubclass(kvrelay.NotFound, LookupError)
    assert issubclass(kvrelay.PermissionDenied, PermissionError)
    for e in (kvrelay.InvalidArgument, kvrelay.RingFull, kvrelay.Timeout, kvrelay.CoordinatorGone,
              kvrelay.NotFound, kvrelay.Aborted, kvrelay.PermissionDenied):
        assert issubclass(e, kvrelay.Error)


def test_attach_errors_name_the_instance():
    with pytest.raises(kvrelay.NotFound, match="py-no-such-instance"):
        kvrelay.Client("py-no-such-instance", timeout=0)
    with pytest.raises(kvrelay.InvalidArgument):
        kvrelay.Client("bad/name", timeout=0)


def test_a_closed_client_raises_instead_of_crashing(pair):
    client = kvrelay.Client(pair[0])
    pool = client.open_pool(0)
    block = pool.block(0, "k", 0)
    client.close()
    assert client.closed
    with pytest.raises(kvrelay.Error, match="closed"):
        client.poll()
    with pytest.raises(kvrelay.Error, match="closed"):
        client.push_layer_done(0, 0, 0)
    del pool
    block[0] = block[0]  # the view keeps its mapping alive on its own
    with pytest.raises(kvrelay.InvalidArgument, match="no block"):
        kvrelay.Client(pair[0]).open_pool(0).block(0, "k", 10_000)


def test_a_second_completion_reader_is_refused_naming_the_first_until_it_closes(lone_instance):
    first = kvrelay.Client(lone_instance.name)
    first.own_completions()
    second = kvrelay.Client(lone_instance.name)
    second.cancel("no-such-request")  # any client may submit
    with pytest.raises(kvrelay.Error, match=f"already read: .*pid {os.getpid()}|already read: another reader in this process"):
        second.poll()
    done = first.wait(timeout=10)
    assert (done.request_id, done.status) == ("no-such-request", "rejected")
    first.close()
    second.own_completions()
    assert second.poll() is None
    second.close()


# ---------------------------------------------------------------- threads, GIL, failures


def test_waiting_releases_the_gil(engine):
    spins = 0
    done = threading.Event()
    result = []

    def waiter():
        try:
            engine.wait(timeout=0.5)
        except kvrelay.Timeout as e:
            result.append(e)
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)  # the waiter is inside wait() now
    while not done.is_set():
        spins += 1  # runs only if wait() let go of the GIL
    t.join()
    assert len(result) == 1
    # With the GIL held by the waiter this loop could run only at the
    # interpreter's 5 ms switch points: a few dozen iterations.
    assert spins > 10_000


def test_many_threads_submit_concurrently_and_each_request_gets_one_completion(engine):
    ids = [f"py-thread-{t}-{i}" for t in range(4) for i in range(50)]

    def submit(chunk):
        for rid in chunk:
            engine.cancel(rid)

    threads = [threading.Thread(target=submit, args=(ids[t * 50:(t + 1) * 50],)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = []
    deadline = time.monotonic() + 20
    while len(seen) < len(ids) and time.monotonic() < deadline:
        seen += [c.request_id for c in engine.completions(timeout=0.2)]
    assert sorted(seen) == sorted(ids)


def test_a_dead_coordinator_is_reported_not_waited_on(lone_instance):
    with kvrelay.Client(lone_instance.name, timeout=30) as client:
        os.kill(lone_instance.process.pid, signal.SIGKILL)
        lone_instance.process.wait()
        with pytest.raises(kvrelay.CoordinatorGone):
            client.wait(timeout=10)
        assert not client.coordinator_alive()


def test_request_ids_with_a_nul_and_out_of_range_signals_are_refused(engine):
    with pytest.raises(kvrelay.InvalidArgument, match="NUL"):
        engine.submit_cache_task("alias\x00one", [1], 16, engine_slot=0)
    with pytest.raises(kvrelay.InvalidArgument, match="NUL"):
        engine.cancel("alias\x00two")
    with pytest.raises(kvrelay.InvalidArgument, match="slot 1000000 is out of range"):
        engine.push_batch(0, 1, [(1_000_000, 0, 16)])
    with pytest.raises(kvrelay.InvalidArgument, match="layer 1000000 is out of range"):
        engine.push_layer_done(0, 1, 1_000_000)
    assert engine.poll() is None


def _worker_signals(instance: str, rank: int) -> int:
    # Not check=True: an unhealthy instance exits 3, and its JSON is just as good.
    out = subprocess.run([str(BIN_DIR / "kvrelay-dump"), instance, "--json"], check=False,
                         capture_output=True, text=True).stdout
    return json.loads(out)["workers"][rank]["counters"]["signals"]


def test_threads_push_signals_concurrently_and_every_record_arrives_once(pair, engine):
    engine.own_signals(0)
    before = _worker_signals(pair[0], 0)
    per_thread = 3000

    def layers():
        for _ in range(per_thread):
            engine.push_layer_done(0, 7, 0)

    def batches():
        for _ in range(per_thread):
            engine.push_batch(0, 7, [(100, 0, 0)])

    threads = [threading.Thread(target=layers), threading.Thread(target=batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 20
    while _worker_signals(pair[0], 0) < before + 2 * per_thread and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _worker_signals(pair[0], 0) == before + 2 * per_thread
    assert engine.session != 0
    assert engine.dropped_completions == 0


def test_a_load_lands_in_the_memfds_an_engine_registered_by_fd_and_nowhere_else(lone_instance):
    """An engine that allocates its own host KV memory in memfds registers it
    by fd and tensor offsets; a swap load then lands in those memfds, in the
    requested blocks only, and wrong input is refused at once."""
    with kvrelay.Client(lone_instance.name, timeout=30) as client:
        config = client.config
        assert config["extra_layers"] == 0 and not config["has_scales"]
        host = [client.open_pool(r, host_tier=True) for r in range(TP)]
        block_bytes = client.open_pool(0).block_bytes(0)
        tensor_bytes = config["num_blocks"] * block_bytes
        n_tensors = 2 * LAYERS  # K, V per layer
        pool_bytes = n_tensors * tensor_bytes
        placements = [(0, t * tensor_bytes) for t in range(n_tensors)]
        fds, maps, memfd_bytes = [], [], []
        try:
            for r in range(TP):
                fd = os.memfd_create(f"py-kv-{r}", os.MFD_ALLOW_SEALING)
                fds.append(fd)
                os.ftruncate(fd, pool_bytes)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
                maps.append(mmap.mmap(fd, pool_bytes))
                memfd_bytes.append(np.frombuffer(maps[-1], dtype=np.uint8))
                memfd_bytes[-1][:] = POISON
                client.register_host_fd_pool(r, [(fd, pool_bytes)], placements)
                c = client.wait(timeout=20)
                assert c.kind == "register_pool" and c.ok, c.message

            dev_blocks, host_blocks = [5, 40, 41], [2, 9, 30]
            for r in range(TP):
                fill(host[r], 11, r, host_blocks)
            client.submit_swap("py-memfd-load", "load", dev_blocks, host_blocks)
            c = wait_for(client, "py-memfd-load")
            assert c.ok, c.message

            for r in range(TP):
                written = np.zeros(pool_bytes, dtype=bool)
                for layer in range(LAYERS):
                    for t in range(2):
                        base = (layer * 2 + t) * tensor_bytes
                        for i, b in enumerate(dev_blocks):
                            begin = base + b * block_bytes
                            got = memfd_bytes[r][begin:begin + block_bytes]
                            assert np.array_equal(got, pattern(11, r, layer, t, i, block_bytes)), \
                                f"rank {r} layer {layer} tensor {t} block {b}"
                            written[begin:begin + block_bytes] = True
                assert (memfd_bytes[r][~written] == POISON).all(), f"rank {r}: a stray write"

            with pytest.raises(kvrelay.InvalidArgument, match="needs bytes"):
                client.register_host_fd_pool(0, [(fds[0], pool_bytes // 2)], placements)
            with pytest.raises(kvrelay.InvalidArgument):
                client.register_host_fd_pool(0, [(fds[0], pool_bytes)], placements[:3])
            assert client.poll() is None
        finally:
            for fd in fds:  # the mappings go with the arrays that view them
                os.close(fd)


def test_an_mla_cache_has_one_tensor_per_layer_and_registers_and_loads_by_fd():
    """A K-only instance (an MLA latent cache): pools have 'k' only, 'v' is
    refused naming what is there, a registration lists one tensor per layer,
    and a swap load lands in the engine's memfds, in its blocks only."""
    inst = Instance(unique("mla"), "mixed", "--k-only", "--total-kv-heads", "1")
    try:
        with kvrelay.Client(inst.name, timeout=30) as client:
            config = client.config
            assert config["k_only"] and config["total_kv_heads"] == 1
            device = client.open_pool(0)
            assert device.tensors == ["k"]
            with pytest.raises(kvrelay.InvalidArgument, match="'k'"):
                device.block(0, "v", 0)
            with pytest.raises(kvrelay.InvalidArgument):
                device.block(0, 1, 0)
            block_bytes = device.block_bytes("k")
            tensor_bytes = config["num_blocks"] * block_bytes
            pool_bytes = LAYERS * tensor_bytes  # one tensor per layer
            placements = [(0, layer * tensor_bytes) for layer in range(LAYERS)]
            host = [client.open_pool(r, host_tier=True) for r in range(TP)]
            fds, maps, memfd_bytes = [], [], []
            try:
                for r in range(TP):
                    fd = os.memfd_create(f"py-mla-{r}", os.MFD_ALLOW_SEALING)
                    fds.append(fd)
                    os.ftruncate(fd, pool_bytes)
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
                    maps.append(mmap.mmap(fd, pool_bytes))
                    memfd_bytes.append(np.frombuffer(maps[-1], dtype=np.uint8))
                    memfd_bytes[-1][:] = POISON
                    with pytest.raises(kvrelay.InvalidArgument):  # K and V: not this pool
                        client.register_host_fd_pool(r, [(fd, 2 * pool_bytes)],
                                                     placements + placements)
                    client.register_host_fd_pool(r, [(fd, pool_bytes)], placements)
                    c = client.wait(timeout=20)
                    assert c.kind == "register_pool" and c.ok, c.message

                dev_blocks, host_blocks = [3, 17, 60], [1, 8, 31]
                for r in range(TP):
                    for layer in range(LAYERS):
                        for i, b in enumerate(host_blocks):
                            v = view(host[r], layer, 0, b)
                            v[:] = pattern(21, r, layer, 0, i, v.size)
                client.submit_swap("py-mla-load", "load", dev_blocks, host_blocks)
                c = wait_for(client, "py-mla-load")
                assert c.ok, c.message
                for r in range(TP):
                    written = np.zeros(pool_bytes, dtype=bool)
                    for layer in range(LAYERS):
                        for i, b in enumerate(dev_blocks):
                            begin = layer * tensor_bytes + b * block_bytes
                            got = memfd_bytes[r][begin:begin + block_bytes]
                            assert np.array_equal(got, pattern(21, r, layer, 0, i, block_bytes)), \
                                f"rank {r} layer {layer} block {b}"
                            written[begin:begin + block_bytes] = True
                    assert (memfd_bytes[r][~written] == POISON).all(), f"rank {r}: a stray write"
                assert client.poll() is None
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        assert inst.stop() == 0
        assert inst.leftover_segments() == []


def test_gpu_calls_say_why_they_cannot_run_without_a_gpu(engine):
    """On a machine without a GPU (or a build without CUDA), every GPU entry
    point raises Unsupported with the reason, and nothing else is affected;
    with a GPU, the GPU tests (tools/gpu-check) cover them instead."""
    layers = LAYERS * 2  # K and V per layer
    try:
        engine.register_cuda_pool(0, [0x7F0000000000] * layers)
    except kvrelay.Unsupported as e:
        assert "CUDA" in str(e) or "cuda" in str(e), str(e)
    except kvrelay.InvalidArgument:
        pytest.skip("a GPU is here: the address is refused as not GPU memory")
    else:
        pytest.fail("registering GPU memory at a bogus address succeeded")
    with pytest.raises(kvrelay.InvalidArgument):
        engine.register_cuda_pool(0, [0x7F0000000000] * 3)  # not one per tensor
    with pytest.raises(kvrelay.Unsupported):
        engine.push_device_step(0, 1, [(0, 0, 16)], LAYERS, 0)
    with pytest.raises(kvrelay.Unsupported):
        engine.stream_wait_layer("no-such-load", 0, 0, timeout=0.1)
    assert isinstance(kvrelay.Unsupported("x"), NotImplementedError)
    # The instance still serves: an evict of nothing-in-particular completes.
    engine.submit_swap("after-gpu-refusals", "evict", [1], [2])
    c = engine.wait(timeout=20)
    assert c.request_id == "after-gpu-refusals" and c.ok, c.message
