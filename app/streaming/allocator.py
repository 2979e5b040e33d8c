"""The worker's memory allocator: jemalloc when it is installed, so that a flood's memory goes back.

CPython's small-object allocator (pymalloc) returns a 1-MB arena to the system only once
every object in it is gone; after a flood's ids are forgotten, the ordinary objects of each
tick land in the arenas the flood opened and keep them (docs/operating.md#floods). With
``TAILGUARD_ALLOCATOR`` ``auto`` (the default) or ``jemalloc``, ``tailguard worker``
re-executes itself once at its start with ``PYTHONMALLOC=malloc`` and jemalloc preloaded
(``LD_PRELOAD``; Debian's ``libjemalloc2``), when it is not running so already:
:func:`reexec_if_asked`, called by ``tailguard``'s own start only (never by a call from Python).
``auto`` without the library goes on with pymalloc and a warning; ``jemalloc`` without it is a
setting error; ``pymalloc`` never re-executes. :func:`describe` is the start-up log line,
:func:`purge` returns jemalloc's freed pages at once (the worker's give-back after a flood,
:mod:`tailguard.streaming.memory`); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from typing import Any, Final

from tailguard import settings as settings_mod
from tailguard.core.contract.config import SettingError

log = logging.getLogger("tailguard.worker")

LIBRARY: Final = "libjemalloc.so.2"
CHOICES: Final = ("auto", "jemalloc", "pymalloc")
#: Unless ``MALLOC_CONF`` is set: pages freed stay mapped until :func:`purge` (jemalloc's own
#: decay would purge a tick's large numpy buffers between ticks: each tick would fault them in
#: again; docs/performance.md#floods).
MALLOC_CONF: Final = "muzzy_decay_ms:-1"
_ARENAS_ALL: Final = 4096        # jemalloc's MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena
_MALLCTL: Any = None


def _mallctl() -> Any:
    """jemalloc's ``mallctl`` when this process runs on jemalloc, else False."""
    global _MALLCTL
    if _MALLCTL is None:
        _MALLCTL = getattr(ctypes.CDLL(None), "mallctl", False)
    return _MALLCTL


def jemalloc_active() -> bool:
    return bool(_mallctl())


def find_jemalloc() -> str | None:
    """The jemalloc library's name for ``LD_PRELOAD`` when the system has it, else None."""
    return ctypes.util.find_library("jemalloc")


def reexec_if_asked() -> None:
    """Re-execute this process (same pid, same arguments) on jemalloc when the setting asks
    for it and it is not so already; return when there is nothing to do."""
    choice = settings_mod.load().allocator
    if choice == "pymalloc" or jemalloc_active():
        return
    library = find_jemalloc()
    if library is None:
        if choice == "jemalloc":
            raise SettingError("TAILGUARD_ALLOCATOR", choice, "auto or pymalloc, or install jemalloc "
                               "(apt-get install libjemalloc2): libjemalloc.so.2 is not on this system")
        return
    env = settings_mod.allocator_environ(library, MALLOC_CONF)
    if env is None:      # asked for already, but not loaded (the loader printed why): go on as is
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def describe(choice: str) -> tuple[int, str]:
    """The log level and line that say which allocator this worker runs on, and why."""
    if jemalloc_active():
        return logging.INFO, (f"memory allocator: jemalloc ({LIBRARY} preloaded, PYTHONMALLOC=malloc; "
                              f"TAILGUARD_ALLOCATOR={choice}): memory freed after a flood goes back "
                              "to the system")
    if choice == "pymalloc":
        return logging.INFO, "memory allocator: CPython's (TAILGUARD_ALLOCATOR=pymalloc)"
    return logging.WARNING, (
        f"memory allocator: CPython's, not jemalloc (TAILGUARD_ALLOCATOR={choice}): "
        + ("libjemalloc.so.2 is not installed (apt-get install libjemalloc2)" if find_jemalloc() is None
           else "it did not load (see the loader's message above)")
        + "; up to a few MB a thousand flood pairs may stay after a flood (docs/operating.md#floods)")


def purge() -> None:
    """Return jemalloc's freed (dirty and muzzy) pages to the system now; no-op elsewhere."""
    mallctl = _mallctl()
    if mallctl:
        mallctl(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, ctypes.c_size_t(0))
