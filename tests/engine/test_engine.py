"""The example engine (examples/kvrelay_engine) end to end: for each
configuration, every request's tokens through kvrelay must be the oracle's
(`engine: N of N requests match the oracle`); and each planted transfer bug
must be caught, naming the request, the layer and the rank.

ctest sets PYTHONPATH (kvrelay's module and examples/) and KVRELAY_BIN_DIR."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the example engine needs python3-torch (tools/setup.sh)")


def run_engine(*args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "kvrelay_engine", *args], capture_output=True,
                       text=True, timeout=600, env=os.environ)
    return p.returncode, p.stdout + p.stderr


CONFIGS = [
    [],                                                   # gqa, TP 2 -> 2, ipc
    ["--prefill-tp", "1", "--decode-tp", "1"],
    ["--prefill-tp", "1", "--decode-tp", "2"],
    ["--prefill-tp", "2", "--decode-tp", "4"],            # 2 KV heads on 4 ranks: replicated
    ["--prefill-tp", "4", "--decode-tp", "2"],
    ["--prefill-tp", "2", "--decode-tp", "1"],
    ["--model", "mla", "--prefill-tp", "2", "--decode-tp", "4"],
    ["--model", "mla", "--prefill-tp", "4", "--decode-tp", "2"],
    ["--protocol", "tcp"],
    ["--protocol", "tcp", "--two-hosts", "--prefill-tp", "1"],   # two network namespaces
    ["--dtype", "float16", "--model", "mla"],
    ["--dtype", "fp8"],                                   # e4m3 with scales per token and head
    ["--dtype", "fp8", "--model", "mla", "--prefill-tp", "1"],
    ["--adapter"],                                        # FastDeploy's call shapes, unchanged
    ["--swap"],                                           # a prefix back from the host tier
    ["--swap", "--model", "mla", "--dtype", "fp8", "--prefill-tp", "1"],
]


@pytest.mark.parametrize("args", CONFIGS, ids=lambda a: " ".join(a) or "default")
def test_every_request_matches_the_oracle(args):
    code, out = run_engine(*args)
    if code == 77:
        pytest.skip(out.strip().splitlines()[-1])
    last = out.strip().splitlines()[-1] if out.strip() else ""
    assert code == 0, out
    if "--two-hosts" in args:  # the KV crossed the veth pair, not loopback or /dev/shm
        m = re.search(r"moved ([\d.]+) MiB of KV cache; the decode host's link received ([\d.]+) MiB", out)
        assert m and float(m.group(2)) >= float(m.group(1)) > 0, out
    m = re.fullmatch(r"engine: (\d+) of (\d+) requests match the oracle", last)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 8, out


PLANTED = [
    (["--plant", "drop-block"], r"request req-7-0 layer 1 V on decode rank 0"),
    (["--plant", "swap-heads", "--decode-tp", "1"], r"request req-7-0 layer 0 K on decode rank 0"),
    (["--model", "mla", "--plant", "drop-block"], r"request req-7-0 layer 1 latent on decode rank 0"),
    (["--swap", "--plant", "lose-swap"], r"request req-7-5 layer 1 V on decode rank 0"),
]


@pytest.mark.parametrize("args,names", PLANTED, ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_a_planted_transfer_bug_is_caught_naming_request_layer_and_rank(args, names):
    code, out = run_engine(*args)
    assert code == 1, out
    assert re.search(names, out), out
    damaged = re.search(r"request (req-\S+)", names).group(1)
    assert f"{damaged}: MISMATCH" in out, out
    assert re.search(r"engine: [0-7] of 8 requests match the oracle", out.strip().splitlines()[-1]), out
