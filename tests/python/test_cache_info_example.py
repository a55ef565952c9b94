"""The example that maps the original's cache_info dictionaries onto kvrelay
(client/python/examples/cache_info_adapter.py), run end to end."""

from __future__ import annotations

import numpy as np

import kvrelay
from cache_info_adapter import FINISHED, WRITE_CACHE_ERROR, CacheInfoAdapter
from conftest import BLOCK_TOKENS, LAYERS, TP


def stamp(pool, blocks, value):
    for layer in range(LAYERS):
        for t in range(2):
            for b in blocks:
                np.frombuffer(pool.block(layer, t, b), dtype=np.uint8)[:] = value


def holds(pool, blocks, value):
    return all((np.frombuffer(pool.block(layer, t, b), dtype=np.uint8) == value).all()
               for layer in range(LAYERS) for t in range(2) for b in blocks)


def finished_within(adapter, count):
    got = []
    for _ in range(100):
        got += adapter.get_finished_req(timeout=0.2)
        if len(got) >= count:
            break
    return got


def test_original_dictionaries_and_kv_signals_per_chunk(pair, engine):
    prefill, decode = pair
    src = [engine.open_pool(r) for r in range(TP)]
    with kvrelay.Client(decode) as d:
        dst = [d.open_pool(r) for r in range(TP)]
    for r in range(TP):
        stamp(src[r], [1, 2, 3, 4], 0x10 + r)
        stamp(dst[r], [50, 51, 52, 53], 0)
    adapter = CacheInfoAdapter(engine, ipc_peer=decode)
    tokens = 4 * BLOCK_TOKENS
    # The decode half first, padded on the left as the original messager did
    # (the decode side holds the first block).
    adapter.put_cache_info([{
        "request_id": "orig-1", "dest_block_ids": [-1, 51, 52, 53], "transfer_protocol": "ipc",
        "ip": "127.0.0.1", "rdma_ports": [], "device_ids": [0, 1]}])
    adapter.put_cache_info([{
        "request_id": "orig-1", "src_block_ids": [1, 2, 3, 4], "current_id": 9,
        "need_prefill_tokens": tokens}])
    # The model runner's signal: [count, layer_id, (slot, offset, len) x count],
    # padded to 512*3+2 int32s as the original's.
    for r in range(TP):
        for layer in range(LAYERS):
            signal = np.full(512 * 3 + 2, -1, dtype=np.int32)
            signal[:5] = [1, layer, 9, 0, tokens]
            adapter.kv_signal(r, 1, signal)
    assert finished_within(adapter, 1) == [("orig-1", FINISHED)]
    for r in range(TP):
        assert holds(dst[r], [51, 52, 53], 0x10 + r)
        assert holds(dst[r], [50], 0)  # the prefix-cached block is never written


def test_original_error_msg_and_legacy_mode(pair, engine):
    prefill, decode = pair
    adapter = CacheInfoAdapter(engine, mode="legacy", ipc_peer=lambda info: decode)
    adapter.put_cache_info([
        {"request_id": "orig-err", "src_block_ids": [1], "current_id": 3,
         "need_prefill_tokens": BLOCK_TOKENS},
        {"request_id": "orig-err", "error_msg": "decode side has no blocks", "device_ids": [0, 1]},
    ])
    assert finished_within(adapter, 1) == [("orig-err", WRITE_CACHE_ERROR)]

    adapter.put_cache_info([
        {"request_id": "orig-legacy", "src_block_ids": [5, 6], "current_id": 40,
         "need_prefill_tokens": 2 * BLOCK_TOKENS},
        {"request_id": "orig-legacy", "dest_block_ids": [7, 8], "transfer_protocol": "ipc",
         "device_ids": [0, 1]},
    ])
    for r in range(TP):
        adapter.legacy_layer_done(r, 40, LAYERS - 1)
    assert finished_within(adapter, 1) == [("orig-legacy", FINISHED)]


def test_connect_tasks_are_answered(pair, engine):
    adapter = CacheInfoAdapter(engine)
    adapter.connect_task({"task_id": 11, "transfer_protocol": "ipc", "peer_instance": pair[1]})
    assert finished_within(adapter, 0) == []
    responses = []
    for _ in range(100):
        adapter.get_finished_req(timeout=0.1)
        responses += adapter.get_connect_responses()
        if responses:
            break
    assert responses == [{"task_id": 11, "success": True, "message": responses[0]["message"]}]
