"""Routing weights on the read side: parsing the weights hash, and nginx's smooth weighted round-robin.

Pure: no I/O, no clock, no randomness. Used by :class:`tailguard.routing.reader.RoutingTable`
(its weighted pick) and by the reference proxy's :class:`tailguard.lb.balance.Balancer`.

Guarantees:

* :func:`parse_weights` turns the ``P:weights:<model>`` hash (node → decimal string in
  (0, 1], the contract in docs/contracts.md) into node → float. A field that is not such a
  number is left out (the node then weighs 1.0, as a node without a field does) and named in
  the second value returned, so the caller can log it; a bad field never fails a read.
* :class:`SmoothWeighted` is nginx's smooth weighted round-robin
  (``ngx_http_upstream_get_peer``): on every pick each node's current weight grows by its
  weight, the largest wins (the first in order on a tie) and loses the total. Over any
  ``sum(units)`` consecutive picks each node gets exactly its ``units`` picks, spread out
  rather than in bursts. Weights are scaled to integer units (:data:`UNITS_PER_WEIGHT` per
  1.0), so the arithmetic is exact and the sequence reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

UNITS_PER_WEIGHT = 1000     # a weight of 1.0 = 1000 units; the smallest weight that counts is 0.001


def parse_weight(raw: bytes | str) -> float | None:
    """A weight from its stored text: a finite number in (0, 1], else ``None``."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    try:
        w = float(text)
    except ValueError:
        return None
    return w if math.isfinite(w) and 0.0 < w <= 1.0 else None


def parse_weights(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> tuple[dict[str, float], list[str]]:
    """``HGETALL`` of a weights hash → (node → weight, the node ids whose value was not a weight)."""
    weights: dict[str, float] = {}
    bad: list[str] = []
    for k, v in raw.items():
        node = k.decode("utf-8") if isinstance(k, bytes) else k
        w = parse_weight(v)
        if w is None:
            bad.append(node)
        else:
            weights[node] = w
    return weights, sorted(bad)


def weight_units(weight: float) -> int:
    """``weight`` (0, 1] in integer units, at least 1."""
    return max(1, round(weight * UNITS_PER_WEIGHT))


def all_full(nodes: Sequence[str], weights: Mapping[str, float]) -> bool:
    """True when every one of ``nodes`` weighs 1.0 (absent = 1.0): plain round-robin applies."""
    return not weights or all(weights.get(n, 1.0) >= 1.0 for n in nodes)


class SmoothWeighted:
    """nginx's smooth weighted round-robin over fixed nodes (see the module docstring).

    ``nodes`` fixes the order (ties go to the earlier node); ``weights`` maps node → (0, 1],
    absent = 1.0.
    """

    __slots__ = ("_current", "_nodes", "_total", "_units")

    def __init__(self, nodes: Sequence[str], weights: Mapping[str, float]) -> None:
        if not nodes:
            raise ValueError("SmoothWeighted needs at least one node")
        self._nodes = tuple(nodes)
        self._units = tuple(weight_units(weights.get(n, 1.0)) for n in self._nodes)
        self._total = sum(self._units)
        self._current = [0] * len(self._nodes)

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    @property
    def units(self) -> tuple[int, ...]:
        return self._units

    def next(self) -> str:
        """The next node."""
        cur = self._current
        best = 0
        for i, u in enumerate(self._units):
            cur[i] += u
            if cur[i] > cur[best]:
                best = i
        cur[best] -= self._total
        return self._nodes[best]
