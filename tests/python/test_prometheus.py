"""kvrelay-dump --prometheus against a live instance, checked by a strict
parser of the Prometheus text exposition format (version 0.0.4): every
sample belongs to the family declared just before it (HELP and TYPE once
each), names and labels are well formed, counters end in _total, no series
repeats, and every histogram's buckets are cumulative, end at +Inf equal to
its _count, and come with a _sum. The values must agree with what the test
did: swaps submitted and finished, and a latency recorded for each."""

from __future__ import annotations

import math
import re
import subprocess

from conftest import BIN_DIR

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? (\S+)$")
LABEL_RE = re.compile(rf'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


def parse(text: str) -> dict[str, dict]:
    """Returns {family: {"type", "help", "samples": [(name, labels, value)]}}; raises on
    anything the format does not allow."""
    families: dict[str, dict] = {}
    current = None
    seen_series = set()
    assert text.endswith("\n"), "the exposition ends with a newline"
    for n, line in enumerate(text.splitlines(), 1):
        where = f"line {n}: {line!r}"
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert re.fullmatch(NAME, name) and help_text, where
            assert name not in families, f"{where}: family {name} declared twice"
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current and families[name]["type"] is None, where
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), where
            families[name]["type"] = kind
            continue
        assert not line.startswith("#") and line.strip(), f"{where}: stray comment or blank line"
        m = SAMPLE.match(line)
        assert m, f"{where}: not a sample"
        name, labels_text, value = m.group(1), m.group(2) or "", m.group(3)
        assert current is not None and families[current]["type"], f"{where}: no family declared"
        kind = families[current]["type"]
        allowed = {current} if kind != "histogram" else {
            current + "_bucket", current + "_sum", current + "_count"}
        assert name in allowed, f"{where}: sample outside its family {current}"
        if kind == "counter":
            assert current.endswith("_total"), f"{where}: a counter's name ends in _total"
        labels = dict(LABEL_RE.findall(labels_text))
        assert len(labels) == labels_text.count('="'), f"{where}: a label repeats"
        v = float(value)  # raises on a malformed value
        assert not math.isnan(v), where
        series = (name, tuple(sorted(labels.items())))
        assert series not in seen_series, f"{where}: the series repeats"
        seen_series.add(series)
        families[current]["samples"].append((name, labels, v))
    for name, f in families.items():
        assert f["type"], f"family {name} has no TYPE"
        if f["type"] == "histogram":
            check_histogram(name, f["samples"])
    return families


def check_histogram(name: str, samples: list) -> None:
    by_series: dict[tuple, dict] = {}
    for sample_name, labels, v in samples:
        key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        s = by_series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if sample_name.endswith("_bucket"):
            s["buckets"].append((float(labels["le"]), v))
        elif sample_name.endswith("_sum"):
            s["sum"] = v
        else:
            s["count"] = v
    for key, s in by_series.items():
        les = [le for le, _ in s["buckets"]]
        counts = [c for _, c in s["buckets"]]
        assert les == sorted(les) and les[-1] == math.inf, f"{name} {key}: le increasing to +Inf"
        assert counts == sorted(counts), f"{name} {key}: buckets are cumulative"
        assert s["count"] is not None and s["sum"] is not None, f"{name} {key}: _sum and _count"
        assert counts[-1] == s["count"], f"{name} {key}: +Inf equals _count"


def value(families, family: str, **labels) -> float:
    for name, l, v in families[family]["samples"]:
        if name == family and all(l.get(k) == x for k, x in labels.items()):
            return v
    raise AssertionError(f"no {family} with {labels}")


def test_prometheus_output_is_well_formed_and_counts_what_happened(pair, engine):
    prefill = pair[0]
    for i in range(3):
        engine.submit_swap(f"prom-evict-{i}", "evict", [i], [i])
    done = [engine.wait(timeout=20) for _ in range(3)]
    assert all(c.ok for c in done), done

    out = subprocess.run([str(BIN_DIR / "kvrelay-dump"), prefill, "--prometheus"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    families = parse(out.stdout)

    assert value(families, "kvrelay_instance_ready", instance=prefill, role="prefill") == 1
    assert value(families, "kvrelay_worker_ready", rank="1") == 1
    assert 0 <= value(families, "kvrelay_ring_fill_ratio", ring="submit") <= 1
    assert value(families, "kvrelay_coordinator_requests_finished_total") >= 3
    assert families["kvrelay_coordinator_live_requests"]["type"] == "gauge"
    latency = families["kvrelay_coordinator_request_latency_seconds"]
    assert latency["type"] == "histogram"
    count = [v for n, _, v in latency["samples"] if n.endswith("_count")]
    assert count and count[0] >= 3
    total = [v for n, _, v in latency["samples"] if n.endswith("_sum")][0]
    assert 0 < total < 60, "seconds, not nanoseconds"
    assert {l["rank"] for _, l, _ in families["kvrelay_worker_tasks_total"]["samples"]} == {"0", "1"}
    # The doorbells' wake-up calls: the coordinator, parked since start-up,
    # was woken by the engine's submissions; every rank has its own series.
    wakes = families["kvrelay_doorbell_wakes_total"]
    assert wakes["type"] == "counter"
    assert value(families, "kvrelay_doorbell_wakes_total", process="coordinator") >= 1
    assert {l.get("rank") for _, l, _ in wakes["samples"] if l.get("process") == "worker"} == {"0", "1"}
    # Every family's HELP says what it counts, not only its own name (the
    # texts beside the labels in worker_counters.h, coordinator_counters.h).
    generic = [n for n, f in families.items() if re.match(r"kvrelay \w+ (counter|histogram) '", f["help"])]
    assert generic == [], f"families whose HELP only repeats their name: {generic}"
    assert families["kvrelay_worker_tcp_lanes_lost_total"]["help"].startswith("tcp lanes that had served")
    # Base units, each once in a name (Prometheus's naming rules).
    for name in families:
        assert "_bytes_bytes" not in name and "megabytes" not in name, name
    assert "kvrelay_worker_layer_copy_rate_bytes_per_second" in families, sorted(families)


def curl(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "10", *extra, url],
                          capture_output=True, text=True, timeout=30)


def test_serve_answers_scrapers_over_http_with_the_same_exposition(pair):
    prefill = pair[0]
    server = subprocess.Popen([str(BIN_DIR / "kvrelay-dump"), prefill, "--serve", "127.0.0.1:0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
        assert m, (line, server.stderr.read() if server.poll() is not None else "")
        base = f"http://127.0.0.1:{m.group(1)}"

        got = curl(f"{base}/metrics", "-i")
        assert got.returncode == 0, got.stderr
        head, _, body = got.stdout.partition("\n\n")  # text mode: \r\n read as \n
        assert head.startswith("HTTP/1.1 200 OK"), head
        assert "Content-Type: text/plain; version=0.0.4" in head, head
        families = parse(body)
        assert value(families, "kvrelay_instance_ready", instance=prefill, role="prefill") == 1
        assert value(families, "kvrelay_worker_ready", rank="0") == 1

        # Scraped again: rendered afresh, still well formed.
        again = curl(f"{base}/metrics", "-f")
        assert again.returncode == 0 and parse(again.stdout)
        missing = curl(f"{base}/nothing-here", "-o", "/dev/null", "-w", "%{http_code}")
        assert missing.stdout == "404", missing
        post = curl(f"{base}/metrics", "-X", "POST", "-o", "/dev/null", "-w", "%{http_code}")
        assert post.stdout == "405", post
    finally:
        server.terminate()
        assert server.wait(timeout=10) == 0, "SIGTERM stops the server cleanly"


def test_serve_says_why_when_the_instance_is_not_there():
    server = subprocess.Popen([str(BIN_DIR / "kvrelay-dump"), "py-no-such-instance", "--serve",
                               "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        port = re.search(r":(\d+)/metrics", server.stdout.readline()).group(1)
        got = curl(f"http://127.0.0.1:{port}/metrics", "-o", "/dev/null", "-w", "%{http_code}")
        assert got.stdout == "503", got
    finally:
        server.terminate()
        server.wait(timeout=10)
    bad = subprocess.run([str(BIN_DIR / "kvrelay-dump"), "x", "--serve", "127.0.0.1:99999"],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "'99999' is not a port" in bad.stderr, bad.stderr


def test_a_malformed_exposition_is_refused_by_the_parser():
    # The parser must be able to fail, or passing it proves nothing.
    good = "# HELP a_total x\n# TYPE a_total counter\na_total{r=\"0\"} 1\n"
    parse(good)
    for bad in [
        good + "a_total{r=\"0\"} 2\n",                      # a repeated series
        "# HELP a x\n# TYPE a counter\na 1\n",               # a counter without _total
        good.replace("a_total{", "b_total{"),                # a sample outside its family
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
        "h_sum 1\nh_count 1\n",                              # not cumulative
        good.rstrip("\n"),                                   # no final newline
    ]:
        try:
            parse(bad)
        except (AssertionError, ValueError):
            continue
        raise AssertionError(f"accepted: {bad!r}")
