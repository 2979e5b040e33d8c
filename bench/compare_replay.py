"""Does this build replay exactly as another one? Every trace, byte for byte.

Run: ``python -m bench.compare_replay --base PATH`` where ``PATH`` is a checkout of the
build to compare against (e.g. ``git worktree add --detach /tmp/base main``; it must have
the ``tailguard`` package name, i.e. be from 2026-12-05 on). The traces:

* every scenario under ``scenarios/`` as ``tailguard simulate trace`` writes it, in the
  single and the batch form (this build's simulator, so both builds read the same bytes);
* with ``--tests``, every trace the replay tests feed to ``replay()`` (tests/scenarios,
  tests/backtest, tests/unit/test_replay.py), recorded with their settings and chunk size
  by a pytest plugin (``-p bench.compare_replay``, ``TAILGUARD_RECORD_REPLAYS=DIR``).

Each trace is replayed in a fresh interpreter once under ``PATH`` (a ``tailguard`` symlink
to ``PATH/app`` first on ``PYTHONPATH``) and once here; every output line and the final
stats line must be identical. Exit status 1 and the first difference when they differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORD_ENV = "TAILGUARD_RECORD_REPLAYS"


# -- recording the tests' traces (a pytest plugin) ------------------------------------------

def pytest_configure(config: Any) -> None:
    """Wrap ``replay()`` so that every call made without a detector saves its trace."""
    out = os.environ.get(RECORD_ENV)
    if not out:
        return
    from tailguard.core.replay import replay as module

    original = module.replay
    counter = [0]

    def recording(lines: Iterable[bytes | str], settings: Any, emit: Callable[[str], object],
                  **kw: Any) -> Any:
        if kw.get("detector") is not None:
            return original(lines, settings, emit, **kw)
        kept: list[bytes | str] = []

        def tee() -> Iterable[bytes | str]:
            for line in lines:
                kept.append(line)
                yield line

        try:
            return original(tee(), settings, emit, **kw)
        finally:
            counter[0] += 1
            name = Path(out) / f"test-{os.getpid()}-{counter[0]:05d}"
            name.with_suffix(".jsonl").write_bytes(
                b"\n".join(x if isinstance(x, bytes) else x.encode() for x in kept))
            name.with_suffix(".json").write_text(json.dumps({
                "settings": dataclasses.asdict(settings), "chunk_lines": kw.get("chunk_lines")}))

    module.replay = recording


# -- replaying (run under each build) --------------------------------------------------------

def run_traces(trace_dir: Path, out: Path) -> None:
    """One line per trace: name, number of output lines, sha256 of the output and stats."""
    import tailguard
    from tailguard.core.contract.config import DetectorSettings
    from tailguard.core.replay.replay import replay

    print(f"[compare_replay] replaying with {Path(tailguard.__file__).parent}", file=sys.stderr)
    with out.open("w") as f:
        for path in sorted(trace_dir.glob("*.jsonl")):
            meta_path = path.with_suffix(".json")
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            settings = DetectorSettings(**meta.get("settings", {}))
            kw = {} if meta.get("chunk_lines") is None else {"chunk_lines": meta["chunk_lines"]}
            lines: list[str] = []
            with path.open("rb") as src:
                _, stats = replay(src, settings, lines.append, **kw)
            text = "\n".join([*lines, stats.summary()])
            f.write(f"{path.name} {len(lines)} {hashlib.sha256(text.encode()).hexdigest()}\n")


def record(args: argparse.Namespace, trace_dir: Path) -> None:
    py = sys.executable
    for scen in sorted((ROOT / "scenarios").glob("*.toml")):
        for form in ("single", "batch"):
            target = trace_dir / f"{scen.stem}.{form}.jsonl"
            subprocess.run([py, "-m", "tailguard.cli", "simulate", "trace", str(scen), "--format", form,
                            "-o", str(target)], check=True, cwd=ROOT)
    print(f"[compare_replay] {len(list(trace_dir.glob('*.jsonl')))} scenario traces", file=sys.stderr)
    if args.tests:
        env = {**os.environ, RECORD_ENV: str(trace_dir), "PYTHONPATH": str(ROOT)}
        # The tests are run for their traces: a failing one (a timeout on a loaded machine) still
        # recorded what it replayed, and the comparison below is what decides.
        done = subprocess.run([py, "-m", "pytest", "-q", "-p", "bench.compare_replay", "-p", "no:cacheprovider",
                               "tests/scenarios", "tests/backtest", "tests/unit/test_replay.py", *args.pytest_args],
                              env=env, cwd=ROOT, check=False)
        if done.returncode not in (0, 1):
            raise SystemExit(f"pytest could not run the replay tests (exit {done.returncode})")
        print(f"[compare_replay] {len(list(trace_dir.glob('*.jsonl')))} traces with the tests'",
              file=sys.stderr)


def replay_under(build: Path | None, trace_dir: Path, out: Path, tmp: Path) -> list[str]:
    env = dict(os.environ)
    if build is not None:
        link_dir = tmp / "base-path"
        link_dir.mkdir(exist_ok=True)
        if not (link_dir / "tailguard").exists():
            (link_dir / "tailguard").symlink_to(build.resolve() / "app")
        env["PYTHONPATH"] = str(link_dir)
    code = ("import sys, pathlib; sys.path.insert(0, sys.argv[3]); from bench.compare_replay import run_traces; "
            "run_traces(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(trace_dir), str(out), str(ROOT)], env=env, check=True,
                   cwd=tmp)
    return out.read_text().splitlines()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="checkout of the build to compare against")
    ap.add_argument("--tests", action="store_true", help="also every trace the replay tests feed to replay()")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments for --tests (after --), e.g. -k")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compare-replay-") as tmp_s:
        tmp = Path(tmp_s)
        trace_dir = tmp / "traces"
        trace_dir.mkdir()
        record(args, trace_dir)
        base = replay_under(Path(args.base), trace_dir, tmp / "base.txt", tmp)
        here = replay_under(None, trace_dir, tmp / "here.txt", tmp)
    for a, b in zip(base, here, strict=False):
        if a != b:
            print(f"DIFFERENT: base {a}\n           here {b}")
            return 1
    if len(base) != len(here):
        print(f"DIFFERENT: base replayed {len(base)} traces, here {len(here)}")
        return 1
    print(f"identical: {len(here)} traces, {sum(int(x.split()[1]) for x in here)} output lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
