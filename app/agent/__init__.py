"""The diagnostics agent: ``tailguard diagnose``, run on each inference node.

It answers the worker's ``node-diagnostics-requests`` for its node id(s) with one result each
on ``node-diagnostics-results`` (the contract the worker reads: ``node_id``, ``model``,
``recoverable``, plus additive evidence fields). Modules, one job each: ``findings`` (the small
frozen types), ``parse`` (pure parsers of tool output: nvidia-smi, dmesg, dcgmi, GEMM, user
checks), ``verdict`` (the pure, table-driven decision), ``checks`` (running the tools, each
with its own timeout, skipped when absent), ``gemm`` (the GEMM timing program, needs torch),
``config`` (TOML file + flags, validated at start), ``runner`` (the Kafka loop), ``cli``.

Guarantees: the checks and user checks never get the Kafka passwords of the agent's own
environment (``checks.Suite``). This package imports nothing from ``tailguard.core``,
``tailguard.streaming``, faust, numpy or redis (``tests/unit/test_agent_config.py``); it
needs only aiokafka and orjson (``pip install 'tailguard[agent]'``), and ``--once`` neither.
"""
