"""The window room: stage 1, from decoded events to one summary per series and tick.

Owns the sample rings (:mod:`.rings`) and where each sits (:mod:`.tiers`), the
per-(node, model) sliding windows (:mod:`.window`), the per-tick summary pass
(:mod:`.summarize`, its per-slab passes in :mod:`.passes`) and the signal a node is
judged on (:mod:`.signals`), the message intake that batches a poll's messages per
series (:mod:`.accumulate`), quantiles (:mod:`.quantiles`) and the cluster-wide
latency pools (:mod:`.pools`), and the bucket-count windows of histogram events
(:mod:`.hist_window`).

Guarantees: imports only the contract room; knows nothing of health, routing
or verdicts — its output is :class:`~tailguard.core.contract.types.WindowSummary`
(and, for histogram pairs, the bucket windows stage 2 reads).
"""
