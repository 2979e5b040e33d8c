"""The status page, served by the worker's faust web server (``TAILGUARD_WEB_PORT``).

Routes (bound to 127.0.0.1 like the rest of faust's web server):

* ``/tailguard/`` — one self-contained HTML file (``app/streaming/static/status.html``: inline
  CSS and JS, no build step, nothing from a CDN) that fetches ``status.json`` every few
  seconds and renders one table per model (node, state, routed with its weight, P50/P99/ratio
  against the peers' medians, since, reason, override), a latency sparkline per node, and the
  model's newest health changes and fleet events.
* ``/tailguard/status.json`` — :func:`page_data`: what Redis holds for every model
  (:mod:`tailguard.routing.keys`), so any worker shows the whole fleet; ``fleet_slow`` is the
  open fleet-slowdown episode's event, shown above the model's table; ``unresolved`` the
  metrics its buckets cannot resolve (judged on each node's mean: docs/scrape.md).

Guarantees: every node id, model name and text goes into the page with
``textContent``/``setAttribute``, never parsed as HTML, so ids holding markup or control
characters show as text. A model with a key of the wrong type is shown with what its other
keys hold and ``errors`` naming the key (:class:`tailguard.routing.status.KeyProblem`). The
page reads Redis only; a worker without a Redis client answers 503 on the JSON route.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from tailguard.core.judge.peers import median
from tailguard.routing.apply_script import EVENTS_CAP
from tailguard.routing.keys import Keys, as_keys, member_text
from tailguard.routing.operators import read_operator_state
from tailguard.routing.status import read_checked, read_status

PAGE_PATH = "/tailguard/"
DATA_PATH = "/tailguard/status.json"
EVENTS_SHOWN = 20


def page_html() -> str:
    return resources.files("tailguard.streaming").joinpath("static/status.html").read_text("utf-8")


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return median(got) if got else None


def _json_list(raw: Any) -> list[Any]:
    try:
        got = json.loads(raw)
    except (ValueError, TypeError):
        return []
    return got if isinstance(got, list) else []


async def page_data(redis: aioredis.Redis, key_prefix: str | Keys, now_s: float,
                    default_mode: str) -> dict[str, Any]:
    """Every model's table, sparklines and newest events (see the module docstring)."""
    keys = as_keys(key_prefix)
    ops = await read_operator_state(redis, keys)
    models: list[dict[str, Any]] = []
    for ms in await read_status(redis, keys):
        m = ms.model
        (raw_hist, raw_events, raw_shadow), problems = await read_checked(
            redis, [("hgetall", keys.history(m), "hash"), ("lrange", keys.events(m), "list"),
                    ("smembers", keys.shadow(m), "set")], EVENTS_CAP)
        raw_hist, raw_events, raw_shadow = raw_hist or {}, raw_events or [], raw_shadow or set()
        history = {member_text(n): _json_list(v) for n, v in raw_hist.items()}
        routed = [n for n in ms.all_nodes() if n in ms.routing]
        peers = {k: _median([_num(ms.nodes.get(n, {}).get(k)) for n in routed])
                 for k in ("p50_us", "p99_us", "ratio")}
        nodes = []
        for n in ms.all_nodes():
            st = ms.nodes.get(n, {})
            nodes.append({
                "node": n, "state": st.get("state", "?"), "routed": n in ms.routing,
                "routed_by_rules": st.get("routed_by_rules", st.get("routed")),
                "p50_us": _num(st.get("p50_us")), "p99_us": _num(st.get("p99_us")),
                "ratio": _num(st.get("ratio")), "since": _num(st.get("since")),
                "reason": st.get("reason"), "override": st.get("override"),
                "weight": ms.weights.get(n, 1.0) if n in ms.routing else None,
                "weight_detail": st.get("weight_detail"),
                "probe_after": ms.quarantine.get(n),
                "history": [[h.get("ts"), *(h.get("lat") or [None, None]), h.get("routed")]
                            for h in history.get(n, []) if isinstance(h, dict)],
            })
        events = []
        for raw in raw_events:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict):
                events.append(ev)
        # The metrics the model's buckets cannot resolve, as its newest status says (a node gone
        # long ago keeps its last one): [{metric, first_bound_s}], sorted.
        newest = max((ms.nodes[n] for n in ms.all_nodes() if isinstance(ms.nodes.get(n), dict)),
                     key=lambda st: _num(st.get("updated")) or 0.0, default={})
        flag = newest.get("unresolved")
        unresolved = ([{"metric": str(k), "first_bound_s": _num(v)} for k, v in sorted(flag.items())]
                      if isinstance(flag, dict) else [])
        # The newest fleet_slow episode event of the kept ones, if it is an opening.
        slow = next((e for e in events if e.get("type") == "fleet"
                     and e.get("kind") in ("fleet_slow", "fleet_slow_end")), None)
        models.append({"model": m, "version": ms.version,
                       "mode": ops.mode_of(m, default_mode),
                       "routing": sorted(ms.routing),
                       "shadow": sorted(member_text(x) for x in raw_shadow),
                       "peers": peers, "nodes": nodes, "events": events[:EVENTS_SHOWN],
                       "fleet_slow": slow if slow is not None and slow["kind"] == "fleet_slow"
                       else None,
                       "unresolved": unresolved,
                       "errors": [p.to_dict() for p in (*ms.errors, *problems)]})
    return {"ts": now_s, "key_prefix": keys.prefix, "models": models}


def register(app: Any, redis: Callable[[], aioredis.Redis | None], key_prefix: str | Keys,
             default_mode: str, clock: Callable[[], float]) -> None:
    """Add the page's routes to a faust ``app`` (its web server must be enabled)."""
    html = page_html().encode("utf-8")

    def _bytes(view: Any, body: bytes, content_type: str, status: int = 200) -> Any:
        return view.bytes(body, content_type=content_type, status=status,
                          headers={"Cache-Control": "no-store"})

    @app.page(PAGE_PATH)  # type: ignore[untyped-decorator]
    async def tailguard_page(self: Any, request: Any) -> Any:
        return _bytes(self, html, "text/html")

    @app.page(DATA_PATH)  # type: ignore[untyped-decorator]
    async def tailguard_status(self: Any, request: Any) -> Any:
        client = redis()
        if client is None:
            return _bytes(self, b'{"error": "this worker has no Redis client"}',
                                "application/json", 503)
        try:
            data = await page_data(client, key_prefix, clock(), default_mode)
        except Exception as e:  # Redis down: the page says so and keeps polling
            body = json.dumps({"error": f"reading Redis failed: {type(e).__name__}: {e}"})
            return _bytes(self, body.encode(), "application/json", 503)
        return _bytes(self, json.dumps(data, allow_nan=False).encode(), "application/json")

