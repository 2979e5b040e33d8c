"""tailguard: find slow inference nodes from request latencies and take them
out of load-balancer routing before they drag the cluster's P99 down.

Layout (each package owns one thing; see README "Code map"):

- ``tailguard.core``      pure detection: events, windows, quantiles, state machine,
                    fleet guards, the detector façade. No I/O, no clock.
- ``tailguard.streaming`` the faust worker: topics, stage-1/stage-2 agents, tables.
- ``tailguard.routing``   the Redis routing writer and the reader load balancers use.
- ``tailguard.emitter``   what inference servers import to publish latency events.
- ``tailguard.lb``        the reference proxy, HAProxy sync, synthetic probes.
- ``tailguard.sim``       fleet simulator, scenario traces, load generator.
- ``tailguard.demo``      the demo (``python -m tailguard.demo``) and the Kafka-free one.
- ``tailguard.replay_cli`` ``tailguard replay`` around the pure ``tailguard.core.replay.replay``.
- ``tailguard.agent``     ``tailguard diagnose``, the diagnostics agent on each node
                    (imports none of the worker's dependencies).
- ``tailguard.settings``  the one place that reads the environment.
- ``tailguard.cli``       the ``tailguard`` command.
"""

__version__ = "0.1.0"
