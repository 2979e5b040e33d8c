"""The diagnostics agent: ``tailguard diagnose``, run on each inference node.

It answers the worker's ``node-diagnostics-requests`` for its node id(s) with
one result each on ``node-diagnostics-results`` (the contract the worker reads:
``node_id``, ``model``, ``recoverable``, plus additive evidence fields).

================  ==========================================================
module            owns
================  ==========================================================
``findings``      the small frozen types: a finding, a check's outcome, a verdict
``parse``         pure parsers of tool output (nvidia-smi, dmesg, dcgmi, GEMM, user
                  checks) into findings — no subprocess, no clock
``verdict``       the pure, table-driven decision: findings → verdict with evidence
``checks``        running the tools, each with its own timeout, skipped when absent
``gemm``          the GEMM timing program (``python -m tailguard.agent.gemm``, needs torch)
``config``        the agent's configuration (TOML file + flags), validated at start
``runner``        the Kafka loop: consume requests, run the suite, publish results
``cli``           ``tailguard diagnose``
================  ==========================================================

Guarantees: the checks and user checks never get the Kafka passwords of the agent's own
environment (``checks.Suite``). This package imports nothing from ``tailguard.core``, ``tailguard.streaming``,
faust, numpy or redis (``tests/unit/test_agent_imports.py``); it needs only
aiokafka and orjson (``pip install 'tailguard[agent]'``), and ``--once`` needs
neither.
"""
