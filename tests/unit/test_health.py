"""Table-driven tests of the per-pair state machine (tailguard.core.judge.health)."""

from __future__ import annotations

import dataclasses

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState as H
from tailguard.core.contract.types import Reason
from tailguard.core.judge import health
from tailguard.core.judge.health import Evidence, Judgement, PairState, Verdict

S = DetectorSettings()
EV = Evidence(signal="latency", p50=100.0, p99=500.0, ratio=5.0, samples=500, peers_p50=100.0,
              latency_p50_us=100.0, latency_p99_us=500.0, hardware="A100")
ABN = Judgement(Verdict.ABNORMAL, str(Reason.P99_P50_RATIO), EV, 1.7)
NOR = Judgement(Verdict.NORMAL, str(Reason.NORMAL), EV)
NONE = health.NO_VERDICT


def pair(state: H = H.HEALTHY, **kw: object) -> PairState:
    base = PairState(node_id="n1", model="m", state=state, since_ts=0.0, first_seen_ts=0.0,
                     reason="x", routed=state in health.ROUTED_STATES)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "judgement", "now", "to", "transition", "streak"),
    [
        # healthy
        (pair(), NOR, 1000.0, H.HEALTHY, None, 0),
        (pair(), NONE, 1000.0, H.HEALTHY, None, 0),
        (pair(), ABN, 1000.0, H.SUSPECT, str(Reason.P99_P50_RATIO), 1),
        (pair(abnormal_streak=1), NOR, 1000.0, H.HEALTHY, None, 0),
        # suspect
        (pair(H.SUSPECT, abnormal_streak=1), ABN, 1000.0, H.SUSPECT, None, 2),
        (pair(H.SUSPECT, abnormal_streak=1), NONE, 1000.0, H.SUSPECT, None, 1),
        (pair(H.SUSPECT, abnormal_streak=2), NOR, 1000.0, H.HEALTHY, str(Reason.NORMAL), 0),
        # reaching confirm_windows: no transition here, the fleet guard decides
        (pair(H.SUSPECT, abnormal_streak=2), ABN, 1000.0, H.SUSPECT, None, 3),
        # warming
        (pair(H.WARMING), ABN, 60.0, H.WARMING, None, 0),
        (pair(H.WARMING), NONE, 119.0, H.WARMING, None, 0),
        (pair(H.WARMING), ABN, 120.0, H.HEALTHY, str(Reason.WARMUP_DONE), 0),
        # unhealthy kept in by a guard
        (pair(H.UNHEALTHY, routed=True, abnormal_streak=3), NOR, 1000.0, H.HEALTHY,
         str(Reason.NORMAL), 0),
        (pair(H.UNHEALTHY, routed=True, abnormal_streak=3), ABN, 1000.0, H.UNHEALTHY, None, 4),
        (pair(H.UNHEALTHY, routed=True, abnormal_streak=3), NONE, 1000.0, H.UNHEALTHY, None, 3),
        # unhealthy ejected → quarantined at the next tick, whatever the verdict
        (pair(H.UNHEALTHY, routed=False, ejections=1, quarantined_at=990.0), NONE, 1000.0,
         H.QUARANTINED, str(Reason.QUARANTINE), 0),
        # retired never moves
        (pair(H.RETIRED, routed=False), NOR, 1000.0, H.RETIRED, None, 0),
    ],
)
def test_step_table(start: PairState, judgement: Judgement, now: float, to: H,
                    transition: str | None, streak: int) -> None:
    new, t = health.step(start, judgement, now, S)
    assert new.state is to
    assert new.abnormal_streak == streak
    if transition is None:
        assert t is None
    else:
        assert t is not None
        assert t.reason == transition
        assert (t.from_state, t.to_state) == (start.state, to)
        assert t.ts == now and t.routed == new.routed


def test_insufficient_data_changes_nothing_in_any_state() -> None:
    for st in (H.HEALTHY, H.SUSPECT, H.UNHEALTHY, H.RETIRED):
        p = pair(st, abnormal_streak=2, routed=st is not H.RETIRED)
        new, t = health.step(p, NONE, 1000.0, S)
        assert new == p and t is None


def test_confirmed_pair_wants_out_and_eject_takes_it_out() -> None:
    p, _ = health.step(pair(H.SUSPECT, abnormal_streak=2), ABN, 1000.0, S)
    assert health.wants_out(p, S)
    new, t = health.eject(p, 1000.0, S)
    assert new.state is H.UNHEALTHY and not new.routed
    assert new.ejections == 1 and new.quarantined_at == 1000.0
    # the first probe round starts when the back-off has passed, not at ejection: requests in
    # flight at ejection (and sent before the LB learns of it) are not probe evidence
    assert new.probe_after_ts == 1030.0 and new.judge_since_ts == 1030.0
    assert t.reason == str(Reason.P99_P50_RATIO) and t.routed is False
    assert t.p50 == 100.0 and t.ratio == 5.0 and t.samples == 500 and t.hardware == "A100"
    assert not health.wants_out(new, S)


def test_keep_in_marks_unhealthy_but_routed_once() -> None:
    p = pair(H.SUSPECT, abnormal_streak=3, fault=str(Reason.RELATIVE_P50))
    new, t = health.keep_in(p, 1000.0, "cap")
    assert new.state is H.UNHEALTHY and new.routed
    assert t is not None and t.reason == str(Reason.EJECTION_CAP) and t.routed
    again, t2 = health.keep_in(new, 1030.0, "cap")
    assert again is new and t2 is None
    # later ejected when room appears: unhealthy → unhealthy, routed=false
    out, t3 = health.eject(again, 1060.0, S)
    assert not out.routed and t3.to_state is H.UNHEALTHY and t3.reason == str(Reason.RELATIVE_P50)


def test_warming_is_never_a_candidate() -> None:
    p = pair(H.WARMING, abnormal_streak=5)
    assert not health.wants_out(p, S)


@pytest.mark.parametrize(
    ("ejections", "failed", "expected"),
    [(1, 0, 30.0), (2, 0, 60.0), (3, 0, 120.0), (4, 0, 240.0), (5, 0, 300.0), (1, 2, 120.0),
     (100, 100, 300.0), (0, 0, 30.0)],
)
def test_backoff_doubles_and_caps(ejections: int, failed: int, expected: float) -> None:
    assert health.backoff_s(ejections, failed, S) == expected


def quarantined(**kw: object) -> PairState:
    base = pair(H.QUARANTINED, routed=False, ejections=1, quarantined_at=1000.0,
                judge_since_ts=1030.0, probe_after_ts=1030.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_quarantined_waits_for_backoff() -> None:
    p = quarantined()
    new, t = health.step(p, NOR, 1020.0, S)
    assert new is p and t is None


def test_probe_passed_readmits_and_keeps_judge_since() -> None:
    new, t = health.step(quarantined(), NOR, 1030.0, S)
    assert new.state is H.HEALTHY and new.routed
    assert t is not None and t.reason == str(Reason.PROBE_PASSED)
    assert new.judge_since_ts == 1030.0          # pre-round samples are never judged again
    assert new.ejections == 1                    # remembered: the next back-off doubles


def test_probe_failed_extends_backoff_and_starts_a_new_round() -> None:
    new, t = health.step(quarantined(), ABN, 1030.0, S)
    assert new.state is H.QUARANTINED and new.failed_probe_rounds == 1
    # the next round begins when its back-off has passed and is judged on its own samples only
    assert new.judge_since_ts == 1030.0 + 60.0 and new.probe_after_ts == 1030.0 + 60.0
    assert t is not None and t.reason == str(Reason.PROBE_FAILED)


def test_probe_without_data_waits() -> None:
    p = quarantined()
    new, t = health.step(p, NONE, 5000.0, S)
    assert new is p and t is None


def test_too_many_failed_probe_rounds_retires() -> None:
    p = quarantined(failed_probe_rounds=S.retire_after_failed_probes - 1)
    new, t = health.step(p, ABN, 2000.0, S)
    assert new.state is H.RETIRED and not new.routed
    assert t is not None and t.reason == str(Reason.TOO_MANY_PROBE_FAILURES)


@pytest.mark.parametrize(
    ("start", "recoverable", "to", "reason"),
    [
        (quarantined(), False, H.RETIRED, str(Reason.DIAGNOSTICS_UNRECOVERABLE)),
        (quarantined(), True, H.QUARANTINED, None),
        (pair(H.UNHEALTHY, routed=False, ejections=1, quarantined_at=1.0, probe_after_ts=31.0),
         True, H.QUARANTINED, str(Reason.DIAGNOSTICS_RECOVERABLE)),
        (pair(H.UNHEALTHY, routed=False, ejections=1), False, H.RETIRED,
         str(Reason.DIAGNOSTICS_UNRECOVERABLE)),
        (pair(H.HEALTHY), False, H.HEALTHY, None),          # routed pairs are never retired by it
        (pair(H.RETIRED, routed=False), True, H.RETIRED, None),
    ],
)
def test_diagnostics(start: PairState, recoverable: bool, to: H, reason: str | None) -> None:
    new, t = health.diagnostics(start, recoverable, 50.0)
    assert new.state is to
    assert (t.reason if t else None) == reason


@pytest.mark.parametrize(
    ("first", "now", "state", "routed"),
    # Admission by evidence: a new pair is never routed at first sight, even past its warm-up.
    [(100.0, 100.0, H.WARMING, False), (0.0, 120.0, H.WARMING, False),
     (150.0, 100.0, H.WARMING, False)],
)
def test_first_seen(first: float, now: float, state: H, routed: bool) -> None:
    p, t = health.first_seen("n", "m", first, now, S, "A10")
    assert p.state is state and p.routed is routed and not p.admitted
    assert t.routed is routed
    assert t.from_state is H.UNKNOWN and t.to_state is state and t.reason == str(Reason.FIRST_SEEN)
    assert p.first_seen_ts <= now


def test_judge_since_by_state() -> None:
    w = pair(H.WARMING, first_seen_ts=100.0)
    assert health.judge_since(w, 200.0, S) is None           # still warming: judge everything
    assert health.judge_since(w, 220.0, S) == 220.0           # warm-up over: only after it
    assert health.judge_since(quarantined(), 5000.0, S) == 1030.0
    assert health.judge_since(quarantined(), 1010.0, S) == 1030.0   # round not begun: judge nothing
    h = pair(judge_since_ts=1000.0)
    assert health.judge_since(h, 1200.0, S) == 1000.0
    assert health.judge_since(h, 1000.0 + S.max_sample_age_s + 1, S) is None
    assert health.judge_since(pair(), 1000.0, S) is None


def test_pair_state_round_trips_through_plain_data() -> None:
    p = quarantined(evidence=EV, fault="p99_p50_ratio", severity=2.0, hardware="A10")
    assert PairState.from_dict(p.to_dict()) == p


# ---- admission by evidence --------------------------------------------------------------------

def new_pair(**kw: object) -> PairState:
    """A pair first seen at 0 (warm-up until 120), not admitted: warming, not routed."""
    p, _ = health.first_seen("n1", "m", 0.0, 0.0, S)
    return dataclasses.replace(p, **kw)  # type: ignore[arg-type]


ADMIT = Judgement(Verdict.NORMAL, str(Reason.ADMITTED), EV)


@pytest.mark.parametrize(
    ("judgement", "now", "to", "routed", "reason", "streak"),
    [
        (ADMIT, 119.0, H.WARMING, False, None, 0),           # warm-up not over: not judged
        (NONE, 200.0, H.WARMING, False, None, 0),            # too few samples: stays out
        (ADMIT, 200.0, H.HEALTHY, True, str(Reason.ADMITTED), 0),
        (ABN, 200.0, H.WARMING, False, None, 1),             # abnormal: streak, still out
    ],
)
def test_a_new_pair_is_routed_only_on_a_normal_verdict_after_warm_up(
        judgement: Judgement, now: float, to: H, routed: bool, reason: str | None, streak: int) -> None:
    new, t = health.step(new_pair(), judgement, now, S)
    assert (new.state, new.routed, new.abnormal_streak) == (to, routed, streak)
    assert (t.reason if t else None) == reason
    assert new.admitted is routed
    if t is not None:
        assert t.routed and new.judge_since_ts == 120.0      # judged from warm-up's end on


def test_a_new_pair_abnormal_in_confirm_windows_is_refused_not_kept_in() -> None:
    p = new_pair(abnormal_streak=S.confirm_windows - 1)
    new, t = health.step(p, ABN, 200.0, S)
    assert t is None and health.wants_out(new, S)       # the guard refuses it (whatever the cap)
    out, t2 = health.eject(new, 200.0, S)
    assert (out.state, out.routed, out.admitted) == (H.UNHEALTHY, False, False)
    assert t2.detail is not None and "admission refused" in t2.detail
    q, _ = health.step(out, NONE, 230.0, S)
    assert q.state is H.QUARANTINED and not q.admitted
    passed, t3 = health.step(q, NOR, (q.probe_after_ts or 0.0) + 1.0, S)
    assert (passed.state, passed.routed, passed.admitted) == (H.HEALTHY, True, True)
    assert t3 is not None and t3.reason == str(Reason.PROBE_PASSED)


def test_restarts_and_returns_keep_admission_and_a_new_pair_stays_out() -> None:
    admitted = pair(judge_since_ts=120.0)
    w, t = health.restart(admitted, 500.0, 510.0, S)
    assert (w.state, w.routed, t.reason) == (H.WARMING, True, str(Reason.RESTARTED))
    assert health.step(w, NONE, 620.0, S)[0].state is H.HEALTHY     # warm-up over: routed on
    waiting, _ = health.restart(new_pair(), 500.0, 510.0, S)
    assert (waiting.state, waiting.routed, waiting.first_seen_ts) == (H.WARMING, False, 500.0)
    gone, _ = health.go_silent(admitted, 600.0, 470.0)
    back, t = health.come_back(gone, 700.0, 701.0, S)
    assert (back.state, back.routed, t.reason) == (H.WARMING, True, str(Reason.RETURNED))
    gone_new, _ = health.go_silent(new_pair(), 600.0, 10.0)
    back_new, _ = health.come_back(gone_new, 700.0, 701.0, S)
    assert (back_new.state, back_new.routed, back_new.admitted) == (H.WARMING, False, False)
    retired = pair(H.RETIRED, routed=False, ejections=2)
    again, _ = health.restart(retired, 900.0, 901.0, S)
    assert (again.state, again.routed, again.admitted, again.ejections) == (H.WARMING, False, False, 0)


def test_snapshots_without_admission_restore_every_pair_admitted_but_the_new_ones() -> None:
    old = pair().to_dict()
    del old["admitted"]
    assert PairState.from_dict(old).admitted
    new = dataclasses.replace(pair(H.WARMING), reason=str(Reason.FIRST_SEEN)).to_dict()
    del new["admitted"]
    assert not PairState.from_dict(new).admitted
    restarted = dataclasses.replace(pair(H.WARMING), reason=str(Reason.RESTARTED)).to_dict()
    del restarted["admitted"]
    assert PairState.from_dict(restarted).admitted
    assert PairState.from_dict(new_pair().to_dict()) == new_pair()
