"""``SyncEmitter``: the emitter for servers that are not asyncio (threads, WSGI, gRPC).

Runs a :class:`~tailguard.emitter.emitter.LatencyEmitter` on its own event loop in a
daemon thread. Guarantees:

* :meth:`SyncEmitter.record` has the same signature and contract as
  ``LatencyEmitter.record``: thread-safe, never blocks on Kafka. It appends
  under a short lock; the loop thread is woken through
  ``loop.call_soon_threadsafe`` only when a series starts a batch or fills
  one — about twice per batch, never once per call, and no cross-thread
  future is created per call.
* :meth:`close` (also at interpreter exit, and on leaving ``with``) flushes
  within ``close_timeout_s`` and stops the thread; later ``record()`` calls
  are counted as dropped.
* Samples recorded before :meth:`start` are buffered and sent once it runs.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any

from tailguard.emitter.emitter import LatencyEmitter
from tailguard.emitter.errors import EmitterStartError
from tailguard.emitter.stats import EmitterStats


class SyncEmitter:
    """``LatencyEmitter`` behind a background thread; same options, blocking-free ``record``.

    ``with SyncEmitter("127.0.0.1:9092") as em: em.record("node-1", "llama", 183000)``
    or ``em = SyncEmitter(...).start()`` … ``em.close()``.
    """

    def __init__(self, bootstrap_servers: str, **options: Any) -> None:
        self._emitter = LatencyEmitter(bootstrap_servers, **options)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._state_lock = threading.Lock()
        self._closed = False
        # The emitter's own bound methods: already thread-safe, fully typed, no extra call frame.
        self.record = self._emitter.record
        self.heartbeat = self._emitter.heartbeat
        self.stop_heartbeat = self._emitter.stop_heartbeat

    @property
    def stats(self) -> EmitterStats:
        return self._emitter.stats

    def start(self, timeout_s: float = 10.0) -> SyncEmitter:
        """Start the loop thread; returns self. Does not wait for Kafka."""
        with self._state_lock:
            if self._thread is not None or self._closed:
                raise RuntimeError("SyncEmitter.start() called twice or after close()")
            self._thread = threading.Thread(target=self._main, name="tailguard-emitter", daemon=True)
            self._thread.start()
        if not self._ready.wait(timeout_s):
            raise EmitterStartError(f"the emitter thread did not start within {timeout_s} s")
        if self._start_error is not None:
            raise EmitterStartError(f"the emitter could not start: {self._start_error!r}") from self._start_error
        atexit.register(self.close)
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._emitter.start())
        except BaseException as e:
            self._start_error = e
            loop.close()
            self._ready.set()
            return
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything buffered now and wait for Kafka's answer (at most ``timeout_s``)."""
        loop = self._loop
        if loop is None or self._closed:
            return
        asyncio.run_coroutine_threadsafe(self._emitter.flush(), loop).result(timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (within ``timeout_s``, default ``close_timeout_s``) and stop the thread. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            thread, loop = self._thread, self._loop
        atexit.unregister(self.close)
        if thread is None or loop is None:
            # Never started (or failed to): account for what was buffered.
            aux = asyncio.new_event_loop()
            try:
                aux.run_until_complete(self._emitter.stop(timeout_s))
            finally:
                aux.close()
            return
        fut = asyncio.run_coroutine_threadsafe(self._emitter.stop(timeout_s), loop)
        try:
            # stop() bounds itself; the margin covers the producer's own close.
            fut.result(None if timeout_s is None else timeout_s + 5.0)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5.0)

    def __enter__(self) -> SyncEmitter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
