"""Real kvrelay instances for the Python tests: kvrelay-coordinator started
as a subprocess (it starts its own kvrelay-worker processes), stopped with
SIGTERM at the end, which must exit 0 and leave nothing in /dev/shm.

ctest sets KVRELAY_BIN_DIR (the built binaries) and PYTHONPATH (the built
module and the examples)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import kvrelay

BIN_DIR = Path(os.environ.get("KVRELAY_BIN_DIR", ""))

# One geometry for every test: small, so that byte checks are quick.
LAYERS = 4
BLOCKS = 64
HOST_BLOCKS = 32
BLOCK_TOKENS = 16
HEAD_DIM = 32
TP = 2


class Instance:
    def __init__(self, name: str, role: str, *extra: str) -> None:
        self.name = name
        coordinator = BIN_DIR / "kvrelay-coordinator"
        if not coordinator.exists():
            pytest.fail(f"{coordinator} does not exist: set KVRELAY_BIN_DIR to the build's bin/")
        self.process = subprocess.Popen(
            [str(coordinator), "--instance", name, "--role", role, "--tp-size", str(TP),
             "--num-layers", str(LAYERS), "--num-blocks", str(BLOCKS),
             "--num-host-blocks", str(HOST_BLOCKS), "--block-size", str(BLOCK_TOKENS),
             "--head-dim", str(HEAD_DIM), "--log-level", "warn", *extra])

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -1

    def leftover_segments(self) -> list[str]:
        return [n for n in os.listdir("/dev/shm") if self.name in n]


def unique(tag: str) -> str:
    return f"py-{tag}-{os.getpid()}-{time.monotonic_ns() % 1_000_000}"


@pytest.fixture(scope="module")
def pair():
    """A decode instance and a prefill instance, shared by a module's tests.
    Yields (prefill_name, decode_name)."""
    decode = Instance(unique("d"), "decode")
    prefill = Instance(unique("p"), "prefill")
    try:
        yield prefill.name, decode.name
    finally:
        assert prefill.stop() == 0
        assert decode.stop() == 0
        assert prefill.leftover_segments() == []
        assert decode.leftover_segments() == []


@pytest.fixture
def engine(pair):
    """A Client of the prefill instance; the test must leave no completion
    unread."""
    with kvrelay.Client(pair[0], timeout=30) as client:
        yield client
        assert client.poll() is None, "a test left a completion unread"


@pytest.fixture
def lone_instance():
    """An instance of its own, for tests that kill it."""
    inst = Instance(unique("lone"), "mixed")
    yield inst
    inst.stop()
    for n in inst.leftover_segments():
        os.unlink(os.path.join("/dev/shm", n))
