"""Does this build replay exactly as another one? Every trace, byte for byte.

Run: ``python -m bench.compare_replay --base PATH [--here PATH] [--tests]``, each ``PATH`` a
checkout of a build (e.g. ``git worktree add --detach /tmp/base main``); ``--here`` is this
checkout unless given. A build from before the ``tailguard`` package name (``app.core``) works
as either side. The traces:

* every scenario under ``scenarios/`` as the here build's ``tailguard simulate trace`` writes
  it, in the single and the batch form (both builds read the same bytes);
* with ``--tests``, every trace that the here build's tests feed to ``replay()`` (every test
  file outside tests/integration that replays, ``tailguard replay`` included), recorded with
  its settings and chunk size by a pytest plugin (``TAILGUARD_RECORD_REPLAYS=DIR``).

Each trace is replayed in a fresh interpreter once under each build (a ``tailguard`` and an
``app`` symlink to ``PATH/app`` first on ``PYTHONPATH``); every output line and the final
stats line must be identical. Exit status 1 and every difference when they differ (``--keep DIR``:
the traces and both builds' results stay in ``DIR``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import shutil
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
    try:
        from tailguard.core.replay import replay as module
    except ImportError:  # a build from before the rooms and the package name
        module = importlib.import_module("app.core.replay")

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
    try:
        import tailguard as package
        from tailguard.core.contract.config import DetectorSettings
        from tailguard.core.replay.replay import replay
    except ImportError:  # a build from before the rooms and the package name
        package = importlib.import_module("app")
        DetectorSettings = importlib.import_module("app.core.config").DetectorSettings
        replay = importlib.import_module("app.core.replay").replay

    print(f"[compare_replay] replaying with {Path(package.__file__).parent}", file=sys.stderr)
    paths = sorted(trace_dir.glob("*.jsonl"))
    with out.open("w") as f:
        for done, path in enumerate(paths, 1):
            if done % 100 == 0 or done == len(paths):
                print(f"[compare_replay] {done}/{len(paths)} traces", file=sys.stderr, flush=True)
            meta_path = path.with_suffix(".json")
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            settings = DetectorSettings(**meta.get("settings", {}))
            kw = {} if meta.get("chunk_lines") is None else {"chunk_lines": meta["chunk_lines"]}
            lines: list[str] = []
            with path.open("rb") as src:
                _, stats = replay(src, settings, lines.append, **kw)
            text = "\n".join([*lines, stats.summary()])
            f.write(f"{path.name} {len(lines)} {hashlib.sha256(text.encode()).hexdigest()}\n")


def replaying_tests(here: Path) -> list[str]:
    """The test files outside tests/integration that call ``replay()`` or ``tailguard replay``."""
    marks = ("replay(", "tailguard.replay_cli", "app.replay_cli")
    return sorted(str(p.relative_to(here)) for p in (here / "tests").rglob("test_*.py")
                  if "integration" not in p.parts and any(m in p.read_text() for m in marks))


def build_path(build: Path, tmp: Path, name: str) -> str:
    """A ``PYTHONPATH`` on which ``tailguard`` (and ``app``) is ``build``'s, then this checkout."""
    link_dir = tmp / f"path-{name}"
    link_dir.mkdir(exist_ok=True)
    for package in ("tailguard", "app"):
        if not (link_dir / package).exists():
            (link_dir / package).symlink_to(build.resolve() / "app")
    recorder = link_dir / "tailguard_replay_recorder.py"  # the plugin under a name no build has
    if not recorder.exists():
        recorder.symlink_to(Path(__file__).resolve())
    return os.pathsep.join([str(link_dir), str(ROOT)])


def record(args: argparse.Namespace, here: Path, trace_dir: Path, tmp: Path) -> None:
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": build_path(here, tmp, "here")}
    for scen in sorted((here / "scenarios").glob("*.toml")):
        for form in ("single", "batch"):
            target = trace_dir / f"{scen.stem}.{form}.jsonl"
            subprocess.run([py, "-m", "tailguard.cli", "simulate", "trace", str(scen), "--format", form,
                            "-o", str(target)], check=True, cwd=here, env=env)
    print(f"[compare_replay] {len(list(trace_dir.glob('*.jsonl')))} scenario traces", file=sys.stderr)
    if args.tests:
        env[RECORD_ENV] = str(trace_dir)
        tests = replaying_tests(here)
        print(f"[compare_replay] recording the traces of {len(tests)} test files: {' '.join(tests)}",
              file=sys.stderr)
        # The tests are run for their traces: a failing one (a timeout on a loaded machine) still
        # recorded what it replayed, and the comparison below is what decides.
        done = subprocess.run([py, "-m", "pytest", "-q", "-p", "tailguard_replay_recorder", "-p",
                               "no:cacheprovider", *tests, *args.pytest_args],
                              env=env, cwd=here, check=False)
        if done.returncode not in (0, 1):
            raise SystemExit(f"pytest could not run the replay tests (exit {done.returncode})")
        print(f"[compare_replay] {len(list(trace_dir.glob('*.jsonl')))} traces with the tests'",
              file=sys.stderr)


def replay_under(build: Path, name: str, trace_dir: Path, out: Path, tmp: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": build_path(build, tmp, name)}
    code = ("import sys, pathlib; from tailguard_replay_recorder import run_traces; "
            "run_traces(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(trace_dir), str(out)], env=env, check=True, cwd=tmp)
    return out.read_text().splitlines()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="checkout of the build to compare against")
    ap.add_argument("--here", default=str(ROOT), help="checkout of the build compared (default: this one)")
    ap.add_argument("--tests", action="store_true", help="also every trace the replay tests feed to replay()")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces and both builds' results in DIR")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments for --tests (after --), e.g. -k")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compare-replay-") as tmp_s:
        tmp = Path(tmp_s)
        trace_dir = tmp / "traces"
        trace_dir.mkdir()
        record(args, Path(args.here), trace_dir, tmp)
        base = replay_under(Path(args.base), "base", trace_dir, tmp / "base.txt", tmp)
        here = replay_under(Path(args.here), "here", trace_dir, tmp / "here.txt", tmp)
        if args.keep:
            shutil.copytree(tmp, args.keep, symlinks=True, dirs_exist_ok=True)
    differ = [(a, b) for a, b in zip(base, here, strict=False) if a != b]
    for a, b in differ:
        print(f"DIFFERENT: base {a}\n           here {b}")
    if len(base) != len(here):
        print(f"DIFFERENT: base replayed {len(base)} traces, here {len(here)}")
        return 1
    if differ:
        print(f"{len(differ)} of {len(here)} traces differ")
        return 1
    print(f"identical: {len(here)} traces, {sum(int(x.split()[1]) for x in here)} output lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
