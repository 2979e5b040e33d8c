"""The worker's allocator: ``tailguard worker`` re-executes itself on jemalloc (TAILGUARD_ALLOCATOR).

The decisions run against a stand-in ``os.execve``; the re-execution itself and the purge
run for real in a child process, on the ``libjemalloc2`` that ``scripts/test`` installs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tailguard import cli
from tailguard import settings as settings_mod
from tailguard.core.contract.config import SettingError
from tailguard.streaming import allocator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """The environments ``os.execve`` was called with (never for real here)."""
    calls: list[dict[str, str]] = []
    monkeypatch.setattr(allocator.os, "execve", lambda exe, argv, env: calls.append(env))
    monkeypatch.setattr(allocator, "jemalloc_active", lambda: False)
    monkeypatch.delenv("TAILGUARD_ALLOCATOR", raising=False)
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    return calls


def test_auto_reexecutes_on_jemalloc_when_the_system_has_it(
        execs: list[dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: "libjemalloc.so.2")
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    allocator.reexec_if_asked()
    assert len(execs) == 1
    assert execs[0]["PYTHONMALLOC"] == "malloc"
    assert execs[0]["LD_PRELOAD"] == "libjemalloc.so.2 /opt/other.so"   # the site's own preload kept
    assert execs[0]["MALLOC_CONF"] == allocator.MALLOC_CONF
    monkeypatch.setenv("MALLOC_CONF", "background_thread:true")
    allocator.reexec_if_asked()
    assert execs[1]["MALLOC_CONF"] == "background_thread:true"             # the site's own kept


@pytest.mark.parametrize("choice", ["auto", "jemalloc", "pymalloc"])
def test_no_reexecution_without_the_library_or_when_told_so(
        choice: str, execs: list[dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: None)
    monkeypatch.setenv("TAILGUARD_ALLOCATOR", choice)
    if choice == "jemalloc":      # asked for explicitly: an error naming the setting and the fix
        with pytest.raises(SettingError, match=r"TAILGUARD_ALLOCATOR.*apt-get install libjemalloc2"):
            allocator.reexec_if_asked()
    else:
        allocator.reexec_if_asked()
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: "libjemalloc.so.2")
    if choice == "pymalloc":
        allocator.reexec_if_asked()
    assert execs == []


def test_an_environment_that_asks_for_it_already_is_not_reexecuted_again() -> None:
    # The loader could not preload it (it printed why): going on beats re-executing for ever.
    env = {"PYTHONMALLOC": "malloc", "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert settings_mod.allocator_environ("libjemalloc.so.2", "", env) is None
    assert settings_mod.allocator_environ("libjemalloc.so.2", "", {"LD_PRELOAD": env["LD_PRELOAD"]}) == {
        "PYTHONMALLOC": "malloc", "LD_PRELOAD": "libjemalloc.so.2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "MALLOC_CONF": ""}


def test_a_call_from_python_never_reexecutes(execs: list[dict[str, str]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # cli.main(["worker"]) from a test or an embedding program must not replace its process.
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: "libjemalloc.so.2")
    monkeypatch.setenv("TAILGUARD_DATA_DIR", "/proc/nope")      # stops the worker early: exit 2
    assert cli.main(["worker"]) == 2
    assert execs == []


def test_the_program_reexecutes_itself_on_jemalloc_with_the_same_pid_and_purges() -> None:
    child = textwrap.dedent("""
        import os, sys
        from tailguard.streaming import allocator
        print("start", os.getpid(), allocator.jemalloc_active(), flush=True)
        allocator.reexec_if_asked()
        junk = [str(i) * 20 for i in range(1_000_000)]      # ~80 MB of small objects
        def rss_mb():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        peak = rss_mb()
        del junk
        allocator.purge()
        print("after", os.getpid(), allocator.jemalloc_active(), round(peak), round(rss_mb()))
    """)
    env = {"PATH": "/usr/bin:/bin", "TAILGUARD_ALLOCATOR": "jemalloc"}
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second, third = out.stdout.split("\n")[:3]
    assert first.split()[2] == "False" and second.split()[2] == "True", out.stdout
    assert first.split()[1] == second.split()[1] == third.split()[1], out.stdout   # exec: same pid
    peak, after = map(int, third.split()[3:5])
    assert after < peak / 3, out.stdout          # freed small objects went back to the system


def test_jemalloc_pages_are_purged_every_few_ticks_and_at_each_give_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tailguard.streaming import memory

    purges: list[int] = []
    monkeypatch.setattr(allocator, "purge", lambda: purges.append(1))
    monkeypatch.setattr(memory, "_again", 0)
    for _ in range(2 * memory.PURGE_EVERY_TICKS):
        memory.after_tick()
    assert len(purges) == 2
    memory.give_back()                  # now, and at each of the next GIVE_BACK_TICKS ticks
    for _ in range(memory.GIVE_BACK_TICKS):
        memory.after_tick()
    assert len(purges) == 3 + memory.GIVE_BACK_TICKS
