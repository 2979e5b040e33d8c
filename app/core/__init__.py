"""Pure detection core, in four rooms by stage.

Imports no faust, aiokafka or redis, reads no clock and no environment
(enforced by ruff's TID251 and by ``tests/unit/test_core_purity.py``).
Time enters as a ``now_s``/``ts`` argument; settings enter as a
:class:`~tailguard.core.contract.config.DetectorSettings`.

The rooms, each importing only from the rooms before it
(``tests/unit/test_imports.py`` checks it):

- :mod:`tailguard.core.contract`: what crosses the seams — the latency-event
  contract and its decoders, node-id rules, value types, settings, errors.
- :mod:`tailguard.core.window`: stage 1 — sample rings, windows and their
  per-tick summaries, message intake, quantiles, pools.
- :mod:`tailguard.core.judge`: stage 2 — rules, references, health state
  machine, guards, admission, liveness, per-model state and the evaluator.
- :mod:`tailguard.core.replay`: both stages in one process — the detector
  façade and event-time replay of traces.
"""
