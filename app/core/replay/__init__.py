"""The replay room: both stages in one process.

Owns the detector façade (:mod:`.detector`: stage 1 windows + stage 2
evaluation in one object, what the demo, tests and replay drive) and the
event-time replay of JSON-lines traces (:mod:`.replay`, the pure part of
``tailguard replay``).

Guarantees: the last room; it may import every other room, and none imports it.
"""
