"""`pip install tailguard[emitter]` is enough for an inference server: a fresh venv with only that.

The package is installed (from a copy of the source, so that no build output
lands in the work tree) into an empty virtual environment, with pip's cache.
In it: ``tailguard.emitter`` imports (beside a server's own ``app`` package), faust/redis/numpy/aiohttp are absent, a
``SyncEmitter`` delivers events to the real broker (read back here and
decoded by the core's parser), and ``tailguard worker`` says which extra it
needs instead of a traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from tailguard.core.contract.events import Heartbeat, SampleBatch, decode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SERVICE_ONLY = ("faust", "mode", "redis", "numpy", "aiohttp", "fastdigest", "prometheus_client", "cramjam")


@pytest.fixture(scope="module")
def emitter_venv(built_once: Callable[[str, Callable[[Path], None]], Path]) -> Path:
    """A venv holding tailguard installed with just the ``emitter`` extra (built once per test
    run, also when pytest-xdist's workers run this module's tests); returns its python."""
    return built_once("emitter-only", _build_emitter_venv) / "venv" / "bin" / "python"


def _build_emitter_venv(base: Path) -> None:
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check",
         f"{src}[emitter]"],
        capture_output=True, text=True, timeout=540, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.timeout(600)
async def test_the_emitter_extra_alone_runs_the_emitter(emitter_venv: Path, topic: str, kafka_bootstrap: str) -> None:
    script = textwrap.dedent(
        """
        import importlib.util, json, sys, time
        from tailguard.emitter import SyncEmitter, LatencyMiddleware
        absent = [m for m in sys.argv[3:] if importlib.util.find_spec(m) is None]
        with SyncEmitter(sys.argv[1], topic=sys.argv[2], linger_s=0.05) as em:
            em.heartbeat("gpu-node-07", "llama-3-70b", hardware="A100")
            for i in range(10):
                em.record("gpu-node-07", "llama-3-70b", latency_us=1000.0 + i, output_tokens=5)
            deadline = time.monotonic() + 30
            while em.stats.heartbeats_sent == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        print(json.dumps({"absent": absent, "sent": em.stats.sent, "dropped": em.stats.dropped}))
        """
    )
    proc = subprocess.run([str(emitter_venv), "-c", script, kafka_bootstrap, topic, *SERVICE_ONLY],
                          capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["absent"] == list(SERVICE_ONLY), "the emitter extra pulled in service dependencies"
    assert out["dropped"] == 0

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    events: list[object] = []
    try:
        for _ in range(30):
            batches = await consumer.getmany(timeout_ms=1000)
            events += [decode(r.value) for records in batches.values() for r in records]
            if sum(len(e) for e in events if isinstance(e, SampleBatch)) >= 10:
                break
    finally:
        await consumer.stop()
    assert any(isinstance(e, Heartbeat) for e in events)
    latencies = sorted(float(x) for e in events if isinstance(e, SampleBatch) for x in e.latency_us)
    assert latencies == [1000.0 + i for i in range(10)]


@pytest.mark.timeout(600)
def test_a_service_command_names_the_worker_extra(emitter_venv: Path) -> None:
    proc = subprocess.run([str(emitter_venv.parent / "tailguard"), "worker"], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/")
    assert proc.returncode == 2
    assert "pip install 'tailguard[worker]'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(600)
def test_a_server_with_its_own_app_package_imports_both(emitter_venv: Path, tmp_path: Path) -> None:
    """The installed import package is ``tailguard``: a server's own ``app`` package (FastAPI's
    convention) is neither shadowed by it nor shadows it."""
    project = tmp_path / "server"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text('WHOSE = "the server\'s own app"\n', encoding="utf-8")
    (project / "app" / "main.py").write_text("from app import WHOSE\n", encoding="utf-8")
    script = textwrap.dedent(
        """
        import json, pathlib, sys, sysconfig
        import app.main
        import tailguard
        from tailguard.emitter import SyncEmitter
        site = pathlib.Path(sysconfig.get_paths()["purelib"])
        print(json.dumps({"whose": app.main.WHOSE, "app_file": app.__file__, "tailguard_file": tailguard.__file__,
                          "emitter": SyncEmitter.__module__, "site_app": (site / "app").exists()}))
        """
    )
    proc = subprocess.run([str(emitter_venv), "-c", script], capture_output=True, text=True, timeout=120,
                          check=False, cwd=project)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["whose"] == "the server's own app"
    assert Path(out["app_file"]).resolve() == (project / "app" / "__init__.py").resolve()
    assert Path(out["tailguard_file"]).resolve().is_relative_to(emitter_venv.parent.parent.resolve())
    assert out["emitter"].startswith("tailguard.emitter")
    assert out["site_app"] is False, "the install put a top-level `app` package into site-packages"
