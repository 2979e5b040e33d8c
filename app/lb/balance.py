"""Which node gets the next request: (weighted) round-robin over the backends not held out, probes, fallback.

Pure and synchronous: no I/O, no clock (``now_s`` is a parameter), no randomness; one
:class:`Balancer` per proxy process, one event loop. In full: docs/lb.md. Guarantees:

* **Never a held-out node.** While tailguard knows the model, :meth:`Balancer.pick` returns
  only known backends not in ``held_out`` (ejected, quarantined, retired, gone, drained):
  the routed nodes and those not judged yet (a new node's traffic is what admits it), each of
  *k* getting one of every *k* consecutive picks while the sets are unchanged.
* **Weights.** With routing weights (node → (0, 1], absent = 1.0) the rotation is smooth
  weighted round-robin (:class:`tailguard.routing.weighted.SmoothWeighted`): each candidate
  gets exactly its units in any cycle of ``sum(units)`` picks, spread out; a change of
  candidates or weights starts a new cycle; all at 1.0 is the plain rotation, unchanged.
* **Fallback, never refusal.** The model unknown (nothing written yet, or Redis unreachable
  before anything was cached) or every known backend held out: ``pick`` rotates over *every*
  known backend, ``fallback=True``. ``exclude`` removes nodes that failed this request.
* **Probe share.** :meth:`Balancer.probe_due` is true for exactly ``floor(n × probe_share)``
  of a model's first *n* requests, evenly spread (a credit counter); :meth:`Balancer.pick_probe`
  rotates over the quarantined, unrouted nodes with an address whose probe time has come
  (``None`` if none: the request goes to a routed node, the slot is not carried over).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.routing.weighted import SmoothWeighted, all_full, weight_units

MAX_PROBE_SHARE = 0.5
_NO_MODEL = ""          # rotation key for requests without a model
_CACHE_LIMIT = 4096     # candidate tuples memoised per (routed set, exclude) pair


@dataclass(frozen=True, slots=True)
class Pick:
    """One dispatch decision: where to send, and why."""

    node_id: str
    url: str
    probe: bool = False       # a quarantined node, sent as probe traffic
    fallback: bool = False    # the routing set was unknown: chosen among all known backends


def _rotate(counters: dict[str, int], key: str, cands: tuple[str, ...] | list[str]) -> str:
    i = counters.get(key, 0)
    counters[key] = i + 1
    return cands[i % len(cands)]


class Balancer:
    """Round-robin over a model's routing set with a probe share (see module docstring)."""

    def __init__(self, backends: Mapping[str, str], *, probe_share: float = 0.02) -> None:
        if not backends:
            raise ValueError("backends must name at least one node_id → URL")
        if not 0.0 <= probe_share <= MAX_PROBE_SHARE:
            raise ValueError(f"probe_share={probe_share!r} must be within 0..{MAX_PROBE_SHARE}")
        self._urls = dict(backends)
        self._all = tuple(sorted(self._urls))
        self._share = probe_share
        self._rr: dict[str, int] = {}
        self._retry_rr: dict[str, int] = {}
        self._probe_rr: dict[str, int] = {}
        self._seen: dict[str, int] = {}
        self._cands: dict[tuple[frozenset[str], frozenset[str]], tuple[str, ...]] = {}
        self._swrr: dict[str, tuple[tuple[str, ...], tuple[int, ...], SmoothWeighted]] = {}

    @property
    def backends(self) -> Mapping[str, str]:
        return self._urls

    @property
    def probe_share(self) -> float:
        return self._share

    def _candidates(self, held_out: frozenset[str], exclude: frozenset[str]) -> tuple[str, ...]:
        key = (held_out, exclude)
        cands = self._cands.get(key)
        if cands is None:
            # Sorted (self._all), so that the rotation order does not depend on set iteration order.
            cands = tuple(n for n in self._all if n not in held_out and n not in exclude)
            if len(self._cands) >= _CACHE_LIMIT:
                self._cands.clear()
            self._cands[key] = cands
        return cands

    def pick(
        self,
        model: str | None,
        routed: frozenset[str] | None,
        *,
        exclude: frozenset[str] = frozenset(),
        held_out: frozenset[str] = frozenset(),
        weights: Mapping[str, float] | None = None,
    ) -> Pick | None:
        """The next backend of ``model`` not held out, by ``weights`` (see module docstring);
        fallback to all known backends; ``None`` if all are excluded."""
        key = model or _NO_MODEL
        cands = self._candidates(held_out, exclude) if routed or held_out else ()
        fallback = not cands
        if fallback:
            cands = self._all if not exclude else tuple(n for n in self._all if n not in exclude)
            if not cands:
                return None
        if exclude:
            # Retries rotate separately, so that a failing node does not shift the main rotation.
            node = _rotate(self._retry_rr, key, cands)
        elif fallback or not weights or all_full(cands, weights):
            node = _rotate(self._rr, key, cands)
        else:
            node = self._weighted(key, cands, weights)
        return Pick(node, self._urls[node], fallback=fallback)

    def _weighted(self, key: str, cands: tuple[str, ...], weights: Mapping[str, float]) -> str:
        units = tuple(weight_units(weights.get(n, 1.0)) for n in cands)
        state = self._swrr.get(key)
        if state is None or state[0] != cands or state[1] != units:
            if len(self._swrr) >= _CACHE_LIMIT:
                self._swrr.clear()
            state = (cands, units, SmoothWeighted(cands, weights))
            self._swrr[key] = state
        return state[2].next()

    def probe_due(self, model: str) -> bool:
        """Whether this request of ``model`` is a probe slot (``floor(n × share)`` of *n*)."""
        if self._share <= 0.0:
            return False
        n = self._seen.get(model, 0) + 1
        self._seen[model] = n
        return int(n * self._share + 1e-9) > int((n - 1) * self._share + 1e-9)

    def pick_probe(
        self,
        model: str,
        routed: frozenset[str] | None,
        quarantined: Mapping[str, float],
        now_s: float,
    ) -> Pick | None:
        """A quarantined node of ``model`` whose probe time has come, in rotation; ``None`` if none is."""
        routed = routed or frozenset()
        cands = sorted(
            n for n, after_s in quarantined.items() if after_s <= now_s and n in self._urls and n not in routed
        )
        if not cands:
            return None
        node = _rotate(self._probe_rr, model, cands)
        return Pick(node, self._urls[node], probe=True)
