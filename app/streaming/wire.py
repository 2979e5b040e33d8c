"""The internal stage-1 → stage-2 messages on ``node-window-stats`` (key = model).

A summary batch (:mod:`tailguard.streaming.summary_batch`: bytes starting ``0xF5 'T' 'S'``,
many summaries of one model; what stage 1 sends) or a JSON object told apart by ``"type"``:

* ``{"type": "summary", …WindowSummary.to_dict()}`` — one (node, model)'s summary of one
  stage-1 tick (what stage 1 sent before the batch; still read);
* ``{"type": "diagnostics", "node_id", "model", "recoverable", "ts", "request_id",
  "arrived_ts"}`` — a
  diagnostics result, re-keyed by model so the worker that owns the model's
  state applies it, in order with the summaries;
* ``{"type": "cluster", "model", "tick_ts", "source", "nodes", "digest"}`` —
  one stage-1 worker's share of a model's cluster-wide raw latency at a tick: a
  t-digest dict (``WindowStore.model_digests``, µs) that stage 2 merges over
  the workers (:class:`ClusterDigest`).

Also validates the public diagnostics-result input
(``node-diagnostics-results``: ``{"node_id", "model", "recoverable": bool, "request_id", …}``).
Guarantee: :func:`decode_stage2` and :func:`parse_diagnostics_result` raise
:class:`~tailguard.core.contract.errors.BadEvent` (never anything else) for bad bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import loads
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window.quantiles import digest_from_dict
from tailguard.streaming.summary_batch import MAGIC as BATCH_MAGIC
from tailguard.streaming.summary_batch import SummaryBatch, decode_batch


@dataclass(frozen=True, slots=True)
class DiagnosticsResult:
    """A node's diagnostics verdict: ``recoverable`` → probe as usual, else retire."""

    node_id: str
    model: str
    recoverable: bool
    ts: float | None = None
    request_id: str | None = None     # the request it answers (stage 2 checks the episode)
    arrived_ts: float | None = None   # its Kafka record's timestamp on node-diagnostics-results


@dataclass(frozen=True, slots=True)
class ClusterDigest:
    """One stage-1 worker's (``source``) share of ``model``'s raw latency at ``tick_ts``.

    ``digest``: a t-digest dict (``tdigest``/``fastdigest`` format) of an even
    thinning of the judged samples of the worker's series of the model
    (``WindowStore.model_pools``: every worker keeps each sample at the same
    rate, so merging the workers' digests gives the cluster's distribution);
    ``nodes``: how many series gave samples.
    """

    model: str
    tick_ts: float
    source: str
    nodes: int
    digest: dict[str, Any]


def _default(o: Any) -> Any:
    item = getattr(o, "item", None)  # numpy scalars
    if callable(item):
        return item()
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"cannot encode {type(o).__name__} in a stage-2 message")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, default=_default, allow_nan=False, separators=(",", ":")).encode()


def encode_summary(s: WindowSummary) -> bytes:
    d = s.to_dict()
    d["type"] = "summary"
    return dumps(d)


def encode_cluster(c: ClusterDigest) -> bytes:
    return dumps({"type": "cluster", "model": c.model, "tick_ts": c.tick_ts, "source": c.source,
                  "nodes": c.nodes, "digest": c.digest})


def encode_diagnostics(d: DiagnosticsResult) -> bytes:
    return dumps({"type": "diagnostics", "node_id": d.node_id, "model": d.model,
                  "recoverable": d.recoverable, "ts": d.ts, "request_id": d.request_id,
                  "arrived_ts": d.arrived_ts})


def _str(d: dict[str, Any], key: str, reason: str = "bad_diagnostics") -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v or len(v) > 256:
        raise BadEvent(reason if v is not None else "missing_field",
                       f"{key} must be a non-empty string of at most 256 chars, got {v!r:.40}",
                       field=key)
    return v


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        else None


def parse_diagnostics_result(raw: bytes | str | None,
                             arrived_ts: float | None = None) -> DiagnosticsResult:
    """Validate one ``node-diagnostics-results`` message (``arrived_ts``: its record's time).

    ``request_id`` is optional here (stage 2 drops, and counts, a result without it).
    """
    if raw is None:
        raise BadEvent("empty_message", "message has no value")
    d = loads(raw)
    if not isinstance(d, dict):
        raise BadEvent("not_object", f"a diagnostics result must be a JSON object, got "
                       f"{type(d).__name__}")
    rec = d.get("recoverable")
    if not isinstance(rec, bool):
        raise BadEvent("bad_diagnostics", f"recoverable must be true or false, got {rec!r:.40}",
                       field="recoverable")
    request_id = None if d.get("request_id") is None else _str(d, "request_id")
    return DiagnosticsResult(_str(d, "node_id"), _str(d, "model"), rec, _number(d.get("ts")),
                             request_id, arrived_ts)


def _cluster(d: dict[str, Any]) -> ClusterDigest:
    ts, nodes, digest = d.get("tick_ts"), d.get("nodes"), d.get("digest")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
        raise BadEvent("bad_type", f"cluster digest needs a numeric tick_ts, got {ts!r:.40}",
                       field="tick_ts")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
        raise BadEvent("bad_type", f"cluster digest needs nodes >= 0, got {nodes!r:.40}",
                       field="nodes")
    if not isinstance(digest, dict):
        raise BadEvent("bad_digest", "cluster digest needs a t-digest dict", field="digest")
    try:
        digest_from_dict(digest)
    except Exception as e:
        raise BadEvent("bad_digest", f"not a t-digest dict: {type(e).__name__}: {e}"[:200],
                       field="digest") from None
    return ClusterDigest(_str(d, "model", "bad_type"), float(ts), _str(d, "source", "bad_type"),
                         nodes, digest)


Stage2Message = WindowSummary | SummaryBatch | DiagnosticsResult | ClusterDigest


def decode_stage2(raw: bytes | str | None) -> Stage2Message:
    """Decode one ``node-window-stats`` message."""
    if raw is None:
        raise BadEvent("empty_message", "message has no value")
    if isinstance(raw, bytes) and raw[:3] == BATCH_MAGIC:
        return decode_batch(raw)
    d = loads(raw)
    if not isinstance(d, dict):
        raise BadEvent("not_object", "a stage-2 message must be a JSON object")
    kind = d.pop("type", None)
    if kind == "diagnostics":    # with the time stage 1 saw it arrive
        return parse_diagnostics_result(raw, _number(d.get("arrived_ts")))
    if kind == "cluster":
        return _cluster(d)
    if kind != "summary":
        raise BadEvent("unknown_form", f"unknown stage-2 message type {kind!r:.40}", field="type")
    try:
        s = WindowSummary.from_dict(d)
    except TypeError as e:
        raise BadEvent("missing_field", f"bad window summary: {e}"[:200]) from None
    if not isinstance(s.node_id, str) or not isinstance(s.model, str) \
            or not isinstance(s.tick_ts, int | float):
        raise BadEvent("bad_type", "window summary needs string node_id/model and numeric tick_ts")
    return s
