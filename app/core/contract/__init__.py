"""The contract room: everything that crosses the core's seams, owned by no stage.

Owns the latency-event contract (JSON, binary and histogram forms, decoding and validation:
:mod:`.events`, :mod:`.events_fast`, :mod:`.binary`, :mod:`.hist_event`, each field's check in
:mod:`.fields`), the rule node ids and model names must meet (:mod:`.ids`), the frozen value
types passed from stage 1 to stage 2 and to the edges (:mod:`.types`), the detector's
settings (:mod:`.config`) and the core's error tree (:mod:`.errors`).

Guarantees: imports nothing from the other rooms (window, judge, replay), so
the emitter, the edges and both stages can depend on it alone.
"""
