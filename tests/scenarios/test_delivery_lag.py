"""A node whose events reach the detector late (an agent's delivery lag under a tick), replayed
with the default settings (backtests of 2026-12-06, docs/replay.md).

At a tick its last ``tick_interval_s`` of event time holds only the samples that have arrived: at
4 req/s and 20 s late, ~40, below ``min_samples``. Stage 1 gives a fresh P50 from a quarter of
``min_samples`` fresh samples, and stage 2 judges it against its peers' full fresh P50s with the
limit raised by its standard error (docs/rules.md, fresh P50). Before: no fresh P50, so a 3x node
waited for its 250-s window's P50 and left 203 s after onset.
"""

from __future__ import annotations

import json

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.replay import replay
from tailguard.sim import outcome, tracegen
from tailguard.sim import scenario as sc


def _fleet(late: str, lag_s: float, *, slow: bool, peak: bool = False, model: str = "",
           rate: float = 4, quiet: str = "") -> sc.Scenario:
    fault = ('[[faults]]\nnode = "gpu-node-05"\nkind = "slowdown"\nonset_s = 617\nfactor = 3\n'
             if slow else "")
    expect = '[[expect.eject]]\nnode = "gpu-node-05"\nwithin_s = 120\n' if slow else ""
    swing = ('[[faults]]\nnode = "*"\nkind = "traffic"\nonset_s = 400\nend_s = 900\n'
             "rate_factor = 2\nfactor = 2.5\n" if peak else "")
    return sc.loads(f"""duration_s = 1200
rate_per_s = {rate}
[[models]]
name = "m"
{model or 'p50_ms = 180'}
[nodes]
count = 8
hardware = "H100"
[nodes.override.{late}]
delivery_lag_s = {lag_s}
{quiet}
{swing}
{fault}
[expect]
others_stay = true
{expect}""", source="test_delivery_lag")


def _check(s: sc.Scenario, seed: int) -> outcome.Outcome:
    out: list[str] = []
    replay(tracegen.lines(tracegen.generate(s, seed)), DetectorSettings(), out.append)
    return outcome.check(s, [json.loads(line) for line in out])


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("peak", [False, True])
def test_a_3x_node_20_s_late_leaves_within_120_s(peak: bool, seed: int) -> None:
    """113 s after onset at every seed, in a quiet fleet and inside a 2.5x peak (before: 203 s
    and 233 s)."""
    s = _fleet("gpu-node-05", 20, slow=True, peak=peak)
    res = _check(s, seed)
    assert res.ok, res.problems
    assert set(res.ejected_at_s) == {("gpu-node-05", "m")}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(("lag_s", "peak"), [(20, False), (20, True), (25, True), (10, True)])
def test_a_healthy_node_that_is_late_stays(lag_s: float, peak: bool, seed: int) -> None:
    """Its newest samples are older than its peers': at a peak's edges they are of the other
    speed for one tick, which confirms nothing."""
    res = _check(_fleet("gpu-node-02", lag_s, slow=False, peak=peak), seed)
    assert res.ok and not res.ejected_at_s, res.problems


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("sigma", [1.0, 1.5])
def test_quiet_heavy_tailed_nodes_among_busier_peers_stay(sigma: float, seed: int) -> None:
    """Five nodes at 0.9 req/s (27 samples a tick) among peers at 4, P99/P50 10 and 33: their
    fresh P50s rest on few samples and scatter; the raised limit keeps them in."""
    quiet = "".join(f"[nodes.override.gpu-node-{n:02d}]\nrate_per_s = 0.9\n" for n in (1, 3, 4, 6, 7))
    s = _fleet("gpu-node-02", 0, slow=False, model=f"p50_ms = 180\nsigma = {sigma}", quiet=quiet)
    res = _check(s, seed)
    assert res.ok and not res.ejected_at_s, res.problems
