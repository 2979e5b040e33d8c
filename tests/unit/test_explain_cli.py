"""``tailguard explain`` rendering and the operator commands' argument handling (no Redis)."""

from __future__ import annotations

import io
import socket

import pytest

from tailguard.routing import explain, operators_cli, status
from tailguard.routing.explain import NodeExplain, render_explain

NOW = 1_764_680_000.0


def entry(ts: float, state: str, routed: bool, p50: float | None, streak: int = 0,
          guards: tuple[str, ...] = ()) -> dict[str, object]:
    return {"ts": ts, "state": state, "routed": routed, "rules_routed": routed, "reason": "x",
            "streak": streak, "stats": {"p50": [p50, 2000.0], "fresh_p50": [None, None],
                                        "p99": [None, 2800.0], "ratio": [1.4, 3.0],
                                        "err": [0.25, 0.1]},
            "guards": list(guards), "probe_after": None, "lat": [p50, None], "mode": "enforce"}


def test_render_shows_rules_against_limits_guards_and_the_next_probe() -> None:
    item = NodeExplain(
        "gpu-7", "llm",
        {"state": "unhealthy", "routed": True, "routed_by_rules": True, "since": NOW - 75,
         "reason": "ejection_cap", "signal": "latency", "mode": "observe",
         "override": {"action": "pin", "by": "ana", "reason": "demo", "until": NOW + 600}},
        [entry(NOW - 2, "suspect", True, 1500.0, 1),
         entry(NOW - 1, "unhealthy", True, 3000.0, 2, ("ejection_cap", "load_event"))],
        in_routing=True, in_shadow=False, probe_after=NOW + 90)
    text = render_explain([item], NOW)
    assert "node 'gpu-7'  model 'llm'  mode observe" in text
    assert "now: unhealthy, in routing, since 1m15s ago; reason ejection_cap" in text
    assert "enforce mode would not route it (shadow set)" in text
    assert "override: pin by ana: demo (ends in 10m00s)" in text
    assert "next probe round: in 1m30s" in text
    assert "abnormal streak: 2" in text
    assert "held by: ejection cap" in text and "held by: load event" in text
    rows = [line for line in text.splitlines()
            if line.startswith("    ") and ("suspect" in line or "unhealthy  yes" in line)]
    assert "1.5ms ≤ 2ms" in rows[0] and "3ms > 2ms" in rows[1], rows
    assert "25.0% > 10.0%" in rows[1] and "1.4 ≤ 3" in rows[1]


def test_a_histogram_signal_is_shown_in_ms_like_latency() -> None:
    """Scraped nodes' values (µs of their e2e histogram) read 6.08e+05 before."""
    hist = [entry(NOW - 1, "healthy", True, 608_000.0)]
    for signal, want in (("e2e_hist", "608ms > 2ms"), ("itl_hist", "608ms > 2ms"),
                         ("normalized", "6.08e+05 > 2e+03")):
        text = render_explain([NodeExplain("n", "m", {"state": "healthy", "signal": signal}, hist)], NOW)
        assert want in text, (signal, text)


def test_render_without_history_says_so() -> None:
    text = render_explain([NodeExplain("n", "m", {"state": "healthy"})], NOW)
    assert "no tick history yet" in text and "out of routing" in text


def test_explain_and_overrides_exit_1_when_redis_is_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TAILGUARD_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    for run in (lambda o, e: explain.main(["n1"], out=o, err=e),
                lambda o, e: operators_cli.drain_main(["n1"], out=o, err=e),
                lambda o, e: operators_cli.release_main(["n1"], out=o, err=e),
                lambda o, e: operators_cli.mode_main(["observe"], out=o, err=e),
                lambda o, e: status.main([], out=o, err=e)):
        out, err = io.StringIO(), io.StringIO()
        assert run(out, err) == 1
        assert "TAILGUARD_REDIS_URL" in err.getvalue() and str(port) in err.getvalue()
        assert out.getvalue() == ""


@pytest.mark.parametrize("argv, message", [
    (["n1", "--ttl", "0"], "--ttl must be > 0 seconds"),
    (["n1", "--ttl", "soon"], "--ttl wants seconds"),
    ([""], "NODE must be a node id"),
])
def test_bad_override_arguments_exit_2_naming_them(argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        operators_cli.drain_main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_render_says_when_the_signal_was_chosen_by_one_worker_s_share() -> None:
    local = render_explain([NodeExplain("n", "m", {"state": "healthy", "signal": "tpot",
                                                   "signal_local": True})], NOW)
    assert "signal tpot chosen by its worker's share of the model alone" in local
    one = render_explain([NodeExplain("n", "m", {"state": "healthy", "signal": "tpot",
                                                 "signal_local": False})], NOW)
    assert "chosen by its worker's share" not in one
