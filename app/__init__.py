"""tailguard: find slow inference nodes from request latencies and take them
out of load-balancer routing before they drag the cluster's P99 down.

Layout (each package owns one thing; see README "Code map"):

- ``app.core``      pure detection: events, windows, quantiles, state machine,
                    fleet guards, the detector façade. No I/O, no clock.
- ``app.streaming`` the faust worker: topics, stage-1/stage-2 agents, tables.
- ``app.routing``   the Redis routing writer and the reader load balancers use.
- ``app.emitter``   what inference servers import to publish latency events.
- ``app.lb``        the reference proxy, HAProxy sync, synthetic probes.
- ``app.sim``       fleet simulator, scenario traces, load generator.
- ``app.demo``      the demo (``python -m app.demo``) and the Kafka-free one.
- ``app.replay_cli`` ``tailguard replay`` around the pure ``app.core.replay``.
- ``app.agent``     ``tailguard diagnose``, the diagnostics agent on each node
                    (imports none of the worker's dependencies).
- ``app.settings``  the one place that reads the environment.
- ``app.cli``       the ``tailguard`` command.
"""

__version__ = "0.1.0"
