"""Producing with clients other than aiokafka: kcat (librdkafka) and the Java producer.

The Java tools run from the Kafka jars that ``scripts/kafka`` keeps in the
cache (``$TAILGUARD_CACHE/kafka-<version>/libs``): ``ConsoleProducer`` for
plain and compressed messages, and ``java/TxProducer.java`` (run by Java's
source launcher, no build step) for transactions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from worker_harness import ROOT

JAVA_DIR = Path(__file__).resolve().parent / "java"
LOG4J = ROOT / "scripts" / "kafka-deps" / "log4j2.properties"
CODECS = ("gzip", "snappy", "lz4", "zstd")


def kafka_libs() -> Path:
    """The Kafka jars fetched by ``scripts/kafka`` (fails, never skips, when absent)."""
    pom = (ROOT / "scripts" / "kafka-deps" / "pom.xml").read_text()
    m = re.search(r"<kafka.version>(.+?)</kafka.version>", pom)
    assert m, "kafka.version not found in scripts/kafka-deps/pom.xml"
    cache = Path(os.environ.get("TAILGUARD_CACHE")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tailguard")
    libs = cache / f"kafka-{m.group(1)}" / "libs"
    assert (libs / ".complete").exists(), f"no Kafka jars in {libs}: run scripts/kafka start once"
    return libs


def _java(args: list[str], data: bytes, timeout_s: float = 60.0) -> None:
    cmd = ["java", f"-Dlog4j2.configurationFile={LOG4J}", "-cp", f"{kafka_libs()}/*", *args]
    r = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout_s)
    assert r.returncode == 0, f"{' '.join(args[:2])} failed ({r.returncode}):\n" \
        f"{r.stderr.decode(errors='replace')[-3000:]}"


def java_console_produce(kafka: str, topic: str, lines: list[tuple[str, str]],
                         codec: str | None = None) -> None:
    """``kafka-console-producer`` (org.apache.kafka.tools.ConsoleProducer): key TAB value lines."""
    args = ["org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", kafka,
            "--topic", topic, "--property", "parse.key=true", "--property", "key.separator=\t"]
    if codec:
        args += ["--compression-codec", codec]
    _java(args, "".join(f"{k}\t{v}\n" for k, v in lines).encode())


def java_tx_produce(kafka: str, topic: str, partition: int, script: list[str]) -> None:
    """Run ``java/TxProducer.java``: ``begin``, ``send<TAB>key<TAB>value``, ``commit``, ``abort``."""
    _java([str(JAVA_DIR / "TxProducer.java"), kafka, topic, str(partition)],
          ("\n".join(script) + "\n").encode())


def kcat_produce(kafka: str, topic: str, data: bytes, *args: str) -> None:
    """``kcat -P`` with ``data`` on stdin (one message per line) and extra flags."""
    r = subprocess.run(["kcat", "-P", "-b", kafka, "-t", topic, *args], input=data,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, f"kcat {' '.join(args)} failed: {r.stderr.decode(errors='replace')}"


def kcat_partitions(kafka: str, topic: str) -> int:
    """The partitions of ``topic`` with a leader in the broker's metadata, as kcat sees them
    (a producer refuses a partition its metadata does not list yet: "Unknown partition")."""
    r = subprocess.run(["kcat", "-L", "-J", "-b", kafka, "-t", topic], capture_output=True, timeout=60)
    assert r.returncode == 0, f"kcat -L failed: {r.stderr.decode(errors='replace')}"
    (t,) = json.loads(r.stdout)["topics"]
    return sum(1 for p in t.get("partitions") or [] if p.get("leader", -1) >= 0)


def event_lines(node: str, model: str, ts: float, n: int, base_us: float = 1000.0) -> list[str]:
    return [json.dumps({"node_id": node, "model": model, "ts": ts, "ok": True,
                        "latency_us": base_us * (1 + 0.1 * ((i * 7) % 5))}) for i in range(n)]


async def node_status(r: Any, prefix: str, model: str) -> dict[str, dict[str, Any]]:
    """``<prefix>:nodes:<model>``: node id → its status JSON (state, samples, …)."""
    raw = await r.hgetall(f"{prefix}:nodes:{model}")
    return {k.decode(): json.loads(v) for k, v in raw.items()}
