"""``tailguard explain NODE [--model M] [--json]`` — why a node is where it is, from Redis.

Reads what the worker's stage-2 edge writes each tick (:mod:`tailguard.streaming.edge`):
the node's status JSON (``P:nodes:<m>``), its tick history (``P:history:<m>``:
each rule's statistic against its limit, the abnormal streak, the guards that
held it, the next probe time), routing and shadow membership, the quarantine
score, the operator override and the routing weight (the one the rules gave, why, and
the one written for load balancers in ``P:weights:<m>``). No worker internals: any machine that reaches
the Redis can explain.

:func:`read_explain` gathers it (one ``MULTI``/``EXEC`` per model);
:func:`render_explain` turns it into text; :func:`explain_text` does both for
callers such as the demo. Exit codes: 0 shown, 1 Redis unreachable or the node
unknown, 2 bad settings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeGuard

import redis.asyncio as aioredis

from tailguard.routing.client import call_redis, keys_for
from tailguard.routing.keys import Keys, as_keys, member_text
from tailguard.routing.status import _age, _status_obj
from tailguard.routing.weighted import parse_weight
from tailguard.settings import load
from tailguard.text import printable

RULES = (("p50", "P50 vs peers"), ("fresh_p50", "fresh P50"), ("p99", "P99 vs peers"),
         ("ratio", "P99/P50"), ("err", "error share"))
GUARD_TEXT = {
    "ejection_cap": "ejection cap: confirmed abnormal, kept in routing (max_ejected_fraction "
                    "reached, or the last routed node)",
    "load_event": "load event: most of the model's nodes abnormal at once, nobody ejected",
    "error_storm": "error storm: most nodes failing at once, nobody ejected for it",
    "observe_mode": "observe mode: the rules would take it out, routing keeps it",
    "operator_drain": "drained by an operator",
    "operator_pin": "pinned by an operator",
    "drain_refused": "drain refused: it would empty the model's routing set",
}


@dataclass(frozen=True, slots=True)
class NodeExplain:
    """What Redis holds about one (node, model)."""

    node_id: str
    model: str
    status: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    in_routing: bool = False
    in_shadow: bool | None = None       # None: no shadow set written (an older worker)
    probe_after: float | None = None
    written_weight: float | None = None  # its field in P:weights:<m> (None: none, weight 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "model": self.model, "status": self.status,
                "history": self.history, "in_routing": self.in_routing,
                "in_shadow": self.in_shadow, "probe_after": self.probe_after,
                "written_weight": self.written_weight}


async def read_explain(redis: aioredis.Redis, key_prefix: str | Keys, node: str,
                       models: Iterable[str] | None = None) -> list[NodeExplain]:
    """The node's entry in every model that knows it (or in ``models``), sorted by model."""
    keys = as_keys(key_prefix)
    wanted = models if models is not None else await redis.smembers(keys.models)
    out: list[NodeExplain] = []
    for m in sorted({member_text(x) for x in wanted}):
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hget(keys.nodes(m), node)
            pipe.hget(keys.history(m), node)
            pipe.sismember(keys.routing(m), node)
            pipe.exists(keys.shadow(m))
            pipe.sismember(keys.shadow(m), node)
            pipe.zscore(keys.quarantine(m), node)
            pipe.hget(keys.weights(m), node)
            (raw_status, raw_hist, routed, has_shadow, shadowed, probe,
             raw_weight) = await pipe.execute()
        if raw_status is None and raw_hist is None and not routed:
            continue
        hist: list[dict[str, Any]] = []
        if raw_hist is not None:
            try:
                loaded = json.loads(raw_hist)
            except ValueError:
                loaded = []
            hist = [h for h in loaded if isinstance(h, dict)] if isinstance(loaded, list) else []
        out.append(NodeExplain(node, m, _status_obj(raw_status) if raw_status is not None else {},
                               hist, bool(routed), bool(shadowed) if has_shadow else None,
                               None if probe is None else float(probe),
                               None if raw_weight is None else parse_weight(raw_weight)))
    return out


def _is_num(x: object) -> TypeGuard[int | float]:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x: object, rule: str, signal: str | None) -> str:
    if not _is_num(x):
        return "-"
    v = float(x)
    if rule == "err":
        return f"{v:.1%}"
    if rule == "ratio" or not (signal in ("latency", "tpot") or (signal or "").endswith("_hist")):
        return f"{v:.3g}"       # "normalized": a ratio to the fleet's fit
    return f"{v / 1000:.3g}ms"  # µs: latency, per token, and a histogram metric's (e2e_hist, …)


def _cell(pair: object, rule: str, signal: str | None) -> str:
    if not isinstance(pair, list) or len(pair) != 2:
        return "-"
    value, limit = pair
    v = _fmt(value, rule, signal)
    if not _is_num(limit):
        return v
    over = _is_num(value) and value > limit
    return f"{v}{' > ' if over else ' ≤ '}{_fmt(limit, rule, signal)}"


def _clock(ts: object) -> str:
    if not _is_num(ts):
        return "-"
    return dt.datetime.fromtimestamp(float(ts), dt.UTC).strftime("%H:%M:%S")


def render_explain(items: list[NodeExplain], now_s: float, *, ticks: int = 8) -> str:
    """Human text: per model, where the node is and why, and its last ``ticks`` ticks."""
    blocks: list[str] = []
    for it in items:
        st, hist = it.status, it.history
        last = hist[-1] if hist else {}
        signal = st.get("signal")
        mode = st.get("mode") or last.get("mode") or "?"
        state = st.get("state", "?")
        since = st.get("since")
        lines = [f"node '{printable(it.node_id)}'  model '{printable(it.model)}'  mode {mode}"]
        where = "in routing" if it.in_routing else "out of routing"
        rules = st.get("routed_by_rules", st.get("routed"))
        if isinstance(rules, bool) and rules != it.in_routing:
            where += f" (the rules say {'in' if rules else 'out'})"
        lines.append(f"  now: {state}, {where}"
                     + (f", since {_age(now_s - since)} ago" if since is not None and _is_num(since)
                        else "")
                     + f"; reason {st.get('reason', '-')}")
        weight = _weight_line(it)
        if weight:
            lines.append(weight)
        if st.get("signal_local"):
            lines.append(f"  signal {signal or '?'} chosen by its worker's share of the model alone "
                         "(no stage-2 choice for the model yet)")
        if it.in_shadow is not None and it.in_shadow != it.in_routing:
            lines.append(f"  enforce mode would {'route' if it.in_shadow else 'not route'} it "
                         "(shadow set)")
        o = st.get("override")
        if isinstance(o, dict):
            text = f"  override: {o.get('action')}"
            if o.get("by"):
                text += f" by {o['by']}"
            if o.get("reason"):
                text += f": {o['reason']}"
            if _is_num(o.get("until")):
                text += f" (ends in {_age(o['until'] - now_s)})"
            lines.append(text)
        probe = it.probe_after if it.probe_after is not None else st.get("probe_after")
        if probe is not None and _is_num(probe):
            lines.append(f"  next probe round: {'now' if probe <= now_s else 'in ' + _age(probe - now_s)}"
                         f" (at {_clock(probe)} UTC)")
        if last:
            lines.append(f"  abnormal streak: {last.get('streak', 0)}")
            guards = [g for g in last.get("guards", []) if isinstance(g, str)]
            for g in guards:
                lines.append(f"  held by: {GUARD_TEXT.get(g, g)}")
        if not hist:
            lines.append("  no tick history yet (the worker writes it each tick)")
        else:
            lines.append(f"  last {min(ticks, len(hist))} ticks (signal {signal or '?'}; "
                         "value > limit breaks the rule):")
            header = ["time", "state", "routed", "streak", *(name for _, name in RULES),
                      "weight", "guards"]
            rows = [header]
            for h in hist[-ticks:]:
                stats = h.get("stats")
                if not isinstance(stats, dict):
                    stats = {}
                rows.append([_clock(h.get("ts")), str(h.get("state", "?")),
                             "yes" if h.get("routed") else "no", str(h.get("streak", 0)),
                             *(_cell(stats.get(k), k, signal) for k, _ in RULES),
                             f"{h['weight']:g}" if _is_num(h.get("weight")) else "-",
                             ",".join(str(g) for g in h.get("guards", [])) or "-"])
            widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
            lines += ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                      for r in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _weight_line(it: NodeExplain) -> str | None:
    """The routing weight the rules gave the node, why, and what load balancers read."""
    st = it.status
    w, detail = st.get("weight"), st.get("weight_detail")
    if not _is_num(w) or (w >= 1.0 and not detail and it.written_weight is None):
        return None
    text = f"  routing weight: {w:g}"
    if detail:
        text += f" ({detail})"
    written = 1.0 if it.written_weight is None else it.written_weight
    if it.in_routing and written != w:
        text += (f"; load balancers read {written:g} (TAILGUARD_WEIGHTS=observe, observe mode "
                 "or a pin)")
    return text


async def explain_text(redis: aioredis.Redis, key_prefix: str | Keys, node: str,
                       model: str | None = None, now_s: float | None = None) -> str:
    """:func:`read_explain` + :func:`render_explain` (for the demo's report)."""
    items = await read_explain(redis, key_prefix, node, None if model is None else [model])
    if not items:
        return f"no node {node!r} in Redis under key prefix {as_keys(key_prefix).prefix!r}"
    return render_explain(items, time.time() if now_s is None else now_s)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard explain",
        description="Why NODE is where it is: its state, routing, override, guards, next probe "
                    "and its last ticks' rule statistics against their limits (from Redis).")
    p.add_argument("node", metavar="NODE")
    p.add_argument("--model", action="append", metavar="M", help="only this model (repeatable)")
    p.add_argument("--ticks", type=int, default=8, help="ticks to show (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO,
               clock: Callable[[], float]) -> int:
    settings = load()
    items = await call_redis(settings, "explain", err,
                             lambda c: read_explain(c, keys_for(settings), args.node, args.model))
    if items is None:
        return 1
    if not items:
        print(f"tailguard explain: no node {args.node!r} in Redis under key prefix "
              f"{settings.key_prefix!r}" + (f" for model(s) {', '.join(args.model)}"
                                             if args.model else ""), file=err)
        return 1
    if args.json:
        json.dump({"ts": clock(), "nodes": [i.to_dict() for i in items]}, out, indent=2)
        out.write("\n")
    else:
        print(render_explain(items, clock(), ticks=max(1, args.ticks)), file=out)
    return 0


def main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None,
         clock: Callable[[], float] = time.time) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(_run(args, out or sys.stdout, err or sys.stderr, clock))
