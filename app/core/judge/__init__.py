"""The judge room: stage 2, from window summaries to transitions and routing sets.

Owns the per-pair rules (:mod:`.rules`) and the references they compare with
(:mod:`.peers`, :mod:`.baseline`, :mod:`.own_history`), the health state machine
of a pair (:mod:`.health`), the fleet guards (:mod:`.guards`), admission of new
pairs (:mod:`.admission`), liveness (:mod:`.liveness`), one model's state and its
snapshot (:mod:`.model_state`), the bucket rules of histogram pairs
(:mod:`.hist_rules`), the verdicts of a model's pairs at one tick (:mod:`.verdicts`)
and the per-tick evaluator (:mod:`.evaluate`).

Guarantees: imports the contract room and, for histogram pairs, the window
room's bucket windows; never the replay room. Pure and deterministic given its
inputs and ``now_s``.
"""
