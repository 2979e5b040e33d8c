"""The health state machine of one (node, model) pair — pure step functions.

Owns :class:`PairState` (a small frozen dataclass) and every rule that moves it between the
:class:`~tailguard.core.contract.types.HealthState` values: :func:`first_seen`, :func:`step` (one tick's
:class:`Judgement`), :func:`eject` / :func:`keep_in`, :func:`diagnostics` (and which results count:
:func:`diagnostics_refusal`), :func:`go_silent`,
:func:`come_back` and :func:`restart`. The states, their transitions and admission by
evidence are drawn in docs/rules.md ("States", "Admission").

Guarantees:

* Pure: the same ``(state, judgement, now_s, settings)`` always gives the same result;
  nothing here reads a clock.
* No verdict (insufficient data) never changes a state: the abnormal streak
  neither grows nor resets.
* A :class:`~tailguard.core.contract.types.Transition` is produced only when the state or the routed flag
  changes, or when a probe round fails (a quarantined node's back-off grows) — never every tick.
* Whether a confirmed node actually leaves routing is decided by the caller
  (the fleet guard in :mod:`tailguard.core.judge.evaluate`) through :func:`eject` or
  :func:`keep_in`; a step alone never takes a routed node out.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import DiagnosticsRequest, HealthState, Reason, Transition, utc_text

ROUTED_STATES = frozenset({HealthState.WARMING, HealthState.HEALTHY, HealthState.SUSPECT})


class Verdict(enum.StrEnum):
    NORMAL = "normal"
    ABNORMAL = "abnormal"
    NONE = "none"            # insufficient data: no verdict


@dataclass(frozen=True, slots=True)
class Evidence:
    """The numbers behind a verdict (``p50``/``p99`` are of ``signal``)."""

    signal: str | None
    p50: float | None
    p99: float | None
    ratio: float | None
    samples: int
    peers_p50: float | None = None
    latency_p50_us: float | None = None
    latency_p99_us: float | None = None
    hardware: str | None = None
    fresh_p50: float | None = None           # of the samples since the previous tick
    peers_fresh_p50: float | None = None     # the reference for it (the peers' fresh P50s)

    def to_dict(self) -> dict[str, Any]:
        # Every field is a str, number or None: a shallow dict is what dataclasses.asdict gives,
        # without its deep copy of each value (most of a 1,000-node model's snapshot time).
        return {name: getattr(self, name) for name in _EVIDENCE_FIELDS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclass(frozen=True, slots=True)
class Judgement:
    """One tick's verdict on one pair. ``severity`` > 1 means past its limit.

    ``windows``: how many consecutive windows an abnormal verdict adds to the
    streak — 1, or 2 when the evaluator credits the previous window too
    (onset credit, see :mod:`tailguard.core.judge.evaluate`).
    """

    verdict: Verdict
    reason: str = ""
    evidence: Evidence | None = None
    severity: float = 0.0
    detail: str | None = None
    windows: int = 1


NO_VERDICT = Judgement(Verdict.NONE)
NORMAL = Judgement(Verdict.NORMAL)


@dataclass(frozen=True, slots=True)
class PairState:
    """Everything remembered about one (node, model) pair between ticks.

    ``judge_since_ts``: samples older than this are not judged (the end of
    warm-up, the start of the current probe round — when its back-off passes —
    and, after re-admission, the start of the round that passed);
    :func:`judge_since` says when the window store must apply it.
    ``fault``/``evidence``/``severity`` describe the latest abnormal verdict
    (or the latest transition), so that an ejection decided later still
    carries its numbers.
    """

    node_id: str
    model: str
    state: HealthState
    since_ts: float
    first_seen_ts: float
    reason: str
    routed: bool
    abnormal_streak: int = 0
    ejections: int = 0
    failed_probe_rounds: int = 0
    quarantined_at: float | None = None
    judge_since_ts: float | None = None
    probe_after_ts: float | None = None
    hardware: str | None = None
    fault: str | None = None
    severity: float = 0.0
    evidence: Evidence | None = None
    admitted: bool = True      # has been routed: a new pair is not until its evidence is normal

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in _PAIR_FIELDS}
        d["state"] = str(self.state)
        d["evidence"] = None if self.evidence is None else self.evidence.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PairState:
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        kw["state"] = HealthState(kw["state"])
        if "admitted" not in kw:
            # Snapshots from before admission: every pair was routed but a new one warming.
            kw["admitted"] = not (kw["state"] is HealthState.WARMING
                                  and kw.get("reason") == Reason.FIRST_SEEN)
        ev = kw.get("evidence")
        kw["evidence"] = None if ev is None else Evidence.from_dict(ev)
        return cls(**kw)


_EVIDENCE_FIELDS = tuple(f.name for f in dataclasses.fields(Evidence))
_PAIR_FIELDS = tuple(f.name for f in dataclasses.fields(PairState))


def backoff_s(ejections: int, failed_probe_rounds: int, settings: DetectorSettings) -> float:
    """Wait before the next probe round: doubles per ejection and failed round, capped."""
    exponent = max(0, ejections - 1) + failed_probe_rounds
    if exponent > 60:
        return settings.backoff_max_s
    return min(settings.backoff_max_s, settings.backoff_initial_s * (2.0 ** exponent))


def warmup_end(state: PairState, settings: DetectorSettings) -> float:
    return state.first_seen_ts + settings.warmup_s


def judge_since(state: PairState, now_s: float, settings: DetectorSettings) -> float | None:
    """The cut-off the window store must apply to this pair at ``now_s``, or None.

    Warming pairs are judged on everything (their numbers are shown, not held
    against them) until warm-up ends; from then on warm-up samples are never
    judged. Out-of-routing pairs are judged only on samples since the current
    probe round began (a round begins when its back-off has passed; before
    that the cut-off lies in the future and nothing is judged). A routed
    pair's cut-off that the age bound already covers is dropped.
    """
    if state.state is HealthState.WARMING:
        end = warmup_end(state, settings)
        return end if end <= now_s else None
    since = state.judge_since_ts
    if since is None:
        return None
    if state.routed and now_s - since > settings.max_sample_age_s:
        return None
    return since


def first_seen(node_id: str, model: str, first_seen_ts: float, now_s: float,
               settings: DetectorSettings, hardware: str | None = None) -> tuple[PairState, Transition]:
    """unknown → warming, out of routing until admitted (see :func:`step`)."""
    first = min(first_seen_ts, now_s)
    new = PairState(node_id=node_id, model=model, state=HealthState.WARMING, since_ts=now_s,
                    first_seen_ts=first, reason=Reason.FIRST_SEEN.value, routed=False,
                    hardware=hardware, admitted=False)
    unknown = dataclasses.replace(new, state=HealthState.UNKNOWN, since_ts=first)
    return new, _transition(unknown, new, now_s, None, detail=(
        f"warm-up until {utc_text(first + settings.warmup_s)}; routed once a window of at least "
        f"{settings.min_samples} judged samples after it looks normal"))


def step(state: PairState, j: Judgement, now_s: float,
         settings: DetectorSettings) -> tuple[PairState, Transition | None]:
    """Apply one tick's judgement. Returns the new state and its transition, if any.

    A routed pair whose streak reaches ``confirm_windows`` is returned
    unchanged in state (see :func:`wants_out`); the caller ejects it or keeps it in.
    """
    s = state.state
    if s is HealthState.HEALTHY or s is HealthState.SUSPECT:
        return _step_routed(state, j, now_s, settings)
    if s is HealthState.WARMING:
        if not state.admitted:
            return _step_admitting(state, j, now_s, settings)
        if now_s >= warmup_end(state, settings):
            new = dataclasses.replace(state, state=HealthState.HEALTHY, since_ts=now_s,
                                      reason=Reason.WARMUP_DONE.value, abnormal_streak=0,
                                      judge_since_ts=warmup_end(state, settings))
            return new, _transition(state, new, now_s, j.evidence)
        return state, None
    if s is HealthState.UNHEALTHY:
        if not state.routed:
            probe_after = (state.quarantined_at or now_s) + backoff_s(state.ejections, 0, settings)
            new = dataclasses.replace(state, state=HealthState.QUARANTINED, since_ts=now_s,
                                      reason=Reason.QUARANTINE.value, probe_after_ts=probe_after)
            return new, _transition(state, new, now_s, state.evidence,
                                    detail=f"probe after {utc_text(probe_after)}")
        if j.verdict is Verdict.NORMAL:
            return _recover(state, j, now_s, Reason.NORMAL.value)
        if j.verdict is Verdict.ABNORMAL:
            return _abnormal(state, j, state.abnormal_streak + 1), None
        return state, None
    if s is HealthState.QUARANTINED:
        return _step_quarantined(state, j, now_s, settings)
    return state, None


def _step_admitting(state: PairState, j: Judgement, now_s: float,
                    settings: DetectorSettings) -> tuple[PairState, Transition | None]:
    """A new pair past warm-up: a normal window admits it (healthy, routed); abnormal ones
    build its streak (the fleet guard refuses it at ``confirm_windows``, see :func:`wants_out`)."""
    if now_s < warmup_end(state, settings) or j.verdict is Verdict.NONE:
        return state, None
    if j.verdict is Verdict.ABNORMAL:
        return _abnormal(state, j, state.abnormal_streak + j.windows), None
    samples = j.evidence.samples if j.evidence is not None else 0
    new = dataclasses.replace(state, state=HealthState.HEALTHY, since_ts=now_s,
                              reason=Reason.ADMITTED.value, routed=True, admitted=True,
                              abnormal_streak=0, judge_since_ts=warmup_end(state, settings),
                              fault=None, severity=0.0, evidence=j.evidence or state.evidence)
    return new, _transition(state, new, now_s, j.evidence, detail=(
        f"{samples} judged samples since warm-up ended at "
        f"{utc_text(warmup_end(state, settings))} look normal"))


def _step_routed(state: PairState, j: Judgement, now_s: float,
                 settings: DetectorSettings) -> tuple[PairState, Transition | None]:
    v = j.verdict
    if v is Verdict.NONE:
        return state, None
    if v is Verdict.NORMAL:
        if state.state is HealthState.HEALTHY:
            if state.abnormal_streak == 0:
                return state, None
            return dataclasses.replace(state, abnormal_streak=0), None
        return _recover(state, j, now_s, Reason.NORMAL.value)
    streak = state.abnormal_streak + j.windows
    if state.state is HealthState.HEALTHY and streak < settings.confirm_windows:
        new = _abnormal(state, j, streak)
        new = dataclasses.replace(new, state=HealthState.SUSPECT, since_ts=now_s, reason=j.reason)
        return new, _transition(state, new, now_s, j.evidence, detail=j.detail)
    return _abnormal(state, j, streak), None


def _abnormal(state: PairState, j: Judgement, streak: int) -> PairState:
    return dataclasses.replace(state, abnormal_streak=streak, fault=j.reason,
                               severity=j.severity, evidence=j.evidence or state.evidence)


def _recover(state: PairState, j: Judgement, now_s: float, reason: str) -> tuple[PairState, Transition]:
    new = dataclasses.replace(state, state=HealthState.HEALTHY, since_ts=now_s, reason=reason,
                              routed=True, abnormal_streak=0, severity=0.0, fault=None)
    return new, _transition(state, new, now_s, j.evidence)


def _step_quarantined(state: PairState, j: Judgement, now_s: float,
                      settings: DetectorSettings) -> tuple[PairState, Transition | None]:
    if state.probe_after_ts is not None and now_s < state.probe_after_ts:
        return state, None
    if j.verdict is Verdict.NONE:
        return state, None
    if j.verdict is Verdict.NORMAL:
        new = dataclasses.replace(state, state=HealthState.HEALTHY, since_ts=now_s,
                                  reason=Reason.PROBE_PASSED.value, routed=True, admitted=True,
                                  abnormal_streak=0,
                                  failed_probe_rounds=0, quarantined_at=None, probe_after_ts=None,
                                  fault=None, severity=0.0, evidence=j.evidence)
        return new, _transition(state, new, now_s, j.evidence,
                                detail=f"probe round since {utc_text(state.judge_since_ts)} looked normal")
    failed = state.failed_probe_rounds + 1
    if failed >= settings.retire_after_failed_probes:
        new = dataclasses.replace(state, state=HealthState.RETIRED, since_ts=now_s,
                                  reason=Reason.TOO_MANY_PROBE_FAILURES.value,
                                  failed_probe_rounds=failed, probe_after_ts=None,
                                  evidence=j.evidence or state.evidence)
        return new, _transition(state, new, now_s, j.evidence,
                                detail=f"{failed} failed probe rounds ({j.reason})")
    probe_after = now_s + backoff_s(state.ejections, failed, settings)
    # The next round starts when its back-off has passed: it is judged on its own samples only.
    new = dataclasses.replace(state, since_ts=now_s, reason=Reason.PROBE_FAILED.value,
                              failed_probe_rounds=failed, judge_since_ts=probe_after,
                              probe_after_ts=probe_after, fault=j.reason,
                              evidence=j.evidence or state.evidence)
    return new, _transition(state, new, now_s, j.evidence,
                            detail=f"{j.reason}; probe round {failed} failed; next after {utc_text(probe_after)}")


def wants_out(state: PairState, settings: DetectorSettings) -> bool:
    """Confirmed abnormal and still routed, or a new pair confirmed abnormal after its
    warm-up: the fleet guard must eject it (refuse it) or keep it in."""
    if state.abnormal_streak < settings.confirm_windows:
        return False
    if state.state is HealthState.WARMING:
        return not state.admitted
    return state.routed


def eject(state: PairState, now_s: float, settings: DetectorSettings) -> tuple[PairState, Transition]:
    """Take a confirmed pair out of routing: → unhealthy, routed=false.

    The first probe round starts when the back-off has passed, not at ejection:
    requests in flight at ejection, and those a load balancer sends before it
    learns of the removal, complete later and are not probe evidence (a round
    judged on them fails even when the node has recovered).
    """
    probe_after = now_s + backoff_s(state.ejections + 1, 0, settings)
    new = dataclasses.replace(state, state=HealthState.UNHEALTHY, since_ts=now_s,
                              reason=state.fault or Reason.CONFIRMED.value, routed=False,
                              ejections=state.ejections + 1, failed_probe_rounds=0,
                              quarantined_at=now_s, judge_since_ts=probe_after, abnormal_streak=0,
                              probe_after_ts=probe_after)
    detail = (f"abnormal in {state.abnormal_streak} consecutive windows; "
              + (f"ejection #{new.ejections}" if state.admitted else "admission refused"))
    return new, _transition(state, new, now_s, state.evidence, detail=detail)


def keep_in(state: PairState, now_s: float, detail: str) -> tuple[PairState, Transition | None]:
    """Confirmed, but a fleet guard keeps it routed: unhealthy, routed=true, ejection_cap."""
    if state.state is HealthState.UNHEALTHY and state.routed:
        return state, None
    new = dataclasses.replace(state, state=HealthState.UNHEALTHY, since_ts=now_s,
                              reason=Reason.EJECTION_CAP.value, routed=True)
    return new, _transition(state, new, now_s, state.evidence, detail=detail)


def episode_request_id(state: PairState) -> str | None:
    """The ``request_id`` of the diagnostics request of the pair's current quarantine episode.

    The request is made at ejection (``quarantined_at``, kept until re-admission or a
    restart), so the id is recomputed from the state: None while no episode is open.
    """
    if state.quarantined_at is None:
        return None
    return DiagnosticsRequest(ts=state.quarantined_at, node_id=state.node_id, model=state.model,
                              reason="").request_id


def diagnostics_refusal(state: PairState | None, request_id: str | None,
                        arrived_ts: float | None) -> str | None:
    """Why a diagnostics result does not count for ``state`` (None: it counts).

    A result counts only if it answers the current episode's request (``request_id``)
    and arrived (``arrived_ts``, when known) no earlier than that request was made:
    ``no_episode`` (unknown pair, or none open), ``no_request_id``, ``wrong_request`` (an
    earlier episode's, or forged), ``before_request``.
    """
    if state is None or state.quarantined_at is None:
        return "no_episode"
    if request_id is None:
        return "no_request_id"
    if request_id != episode_request_id(state):
        return "wrong_request"
    if arrived_ts is not None and arrived_ts < state.quarantined_at:
        return "before_request"
    return None


def diagnostics(state: PairState, recoverable: bool,
                now_s: float) -> tuple[PairState, Transition | None]:
    """Apply a diagnostics result. Only out-of-routing pairs are affected.

    Unrecoverable → retired. Recoverable → probing goes on as usual (an
    unhealthy pair moves on to quarantine at once).
    """
    if state.routed or state.state is HealthState.RETIRED:
        return state, None
    if not recoverable:
        new = dataclasses.replace(state, state=HealthState.RETIRED, since_ts=now_s,
                                  reason=Reason.DIAGNOSTICS_UNRECOVERABLE.value, probe_after_ts=None)
        return new, _transition(state, new, now_s, state.evidence)
    if state.state is HealthState.UNHEALTHY:
        new = dataclasses.replace(state, state=HealthState.QUARANTINED, since_ts=now_s,
                                  reason=Reason.DIAGNOSTICS_RECOVERABLE.value)
        return new, _transition(state, new, now_s, state.evidence,
                                detail=f"probe after {utc_text(new.probe_after_ts)}")
    return state, None


def go_silent(state: PairState, now_s: float, last_seen_ts: float) -> tuple[PairState, Transition]:
    """No sample or heartbeat since ``last_seen_ts``: → gone, out of routing.

    Not an ejection: ``ejections`` and the quarantine fields are kept as they were, so a
    node that was out before it fell silent comes back to be probed (see :func:`come_back`).
    """
    new = dataclasses.replace(state, state=HealthState.GONE, since_ts=now_s, routed=False,
                              reason=Reason.SILENT.value, abnormal_streak=0)
    return new, _transition(state, new, now_s, None,
                            detail=f"no sample or heartbeat for {now_s - last_seen_ts:.0f} s "
                                   f"(last at {utc_text(last_seen_ts)})")


def come_back(state: PairState, seen_ts: float, now_s: float,
              settings: DetectorSettings) -> tuple[PairState, Transition]:
    """A gone pair reports again (sample or heartbeat at ``seen_ts``).

    Back through warm-up (routed if it was admitted, judged from ``seen_ts + warmup_s`` on;
    see :func:`restart`); a pair that was
    out of routing when it fell silent (quarantined or ejected) is quarantined again and
    probed at once instead — silence never re-admits a slow node.
    """
    if state.quarantined_at is not None:
        new = dataclasses.replace(state, state=HealthState.QUARANTINED, since_ts=now_s,
                                  reason=Reason.RETURNED.value, routed=False,
                                  judge_since_ts=now_s, probe_after_ts=now_s)
        return new, _transition(state, new, now_s, None, detail="out of routing before it fell "
                                "silent: probed from now on")
    return restart(state, seen_ts, now_s, settings, reason=Reason.RETURNED.value)


def restart(state: PairState, restart_ts: float, now_s: float, settings: DetectorSettings,
            reason: str = Reason.RESTARTED.value) -> tuple[PairState, Transition]:
    """The node's process started anew at ``restart_ts``: warming again, its warm-up samples
    never judged; its abnormal streak and fault are dropped. An admitted pair stays routed
    through it (a rolling restart never empties a fleet); one not admitted yet starts its
    warm-up over, still out. A retired node back as a new process is a new node: its
    ejection history and its admission go too."""
    start = min(restart_ts, now_s)
    if state.state is HealthState.RETIRED:
        state = dataclasses.replace(state, ejections=0, failed_probe_rounds=0, quarantined_at=None,
                                    probe_after_ts=None, admitted=False)
    done = state.admitted and start + settings.warmup_s <= now_s
    new = dataclasses.replace(state, state=HealthState.HEALTHY if done else HealthState.WARMING,
                              since_ts=now_s, first_seen_ts=start, reason=reason,
                              routed=state.admitted, abnormal_streak=0, fault=None, severity=0.0,
                              judge_since_ts=start + settings.warmup_s if done and settings.warmup_s > 0
                              else None)
    return new, _transition(state, new, now_s, None,
                            detail=f"warm-up until {utc_text(start + settings.warmup_s)}")


def _transition(old: PairState, new: PairState, now_s: float, ev: Evidence | None,
                detail: str | None = None) -> Transition:
    if ev is None:
        return Transition(ts=now_s, node_id=new.node_id, model=new.model, from_state=old.state,
                          to_state=new.state, routed=new.routed, reason=new.reason,
                          hardware=new.hardware, detail=detail, from_since_ts=old.since_ts)
    return Transition(ts=now_s, node_id=new.node_id, model=new.model, from_state=old.state,
                      to_state=new.state, routed=new.routed, reason=new.reason, signal=ev.signal,
                      p50=ev.p50, p99=ev.p99, ratio=ev.ratio, samples=ev.samples,
                      peers_p50=ev.peers_p50, latency_p50_us=ev.latency_p50_us,
                      latency_p99_us=ev.latency_p99_us, hardware=ev.hardware or new.hardware,
                      fresh_p50=ev.fresh_p50, peers_fresh_p50=ev.peers_fresh_p50, detail=detail,
                      from_since_ts=old.since_ts)
