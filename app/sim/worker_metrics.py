"""A running worker's Prometheus metrics as plain numbers, for the drivers that load one.

For benchmarks and integration tests that watch a ``tailguard worker`` they started
(``bench/bench_cost_curve.py``, ``bench/bench_scale_out.py``,
``tests/integration/test_summary_handoff.py``): one HTTP GET of ``/metrics`` on 127.0.0.1,
parsed with ``prometheus_client``'s text parser.

Guarantees:

* :func:`read` keys each sample by its name (with the parser's ``_total``/``_sum``/``_count``
  suffix) and ``|<value>`` of each label (``labels``: of those only, in the sample's order);
  samples that share a key (labels left out) are summed.
* A worker that does not answer yet (starting, or gone) reads as ``{}``: never an exception
  for an unreachable port, so callers poll it with a deadline of their own.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families


def read(port: int, labels: Collection[str] | None = None, timeout_s: float = 5.0) -> dict[str, float]:
    """The worker's metrics on ``port`` (module docstring), ``{}`` while it starts; ``labels``:
    the labels that tell samples apart (None: all)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s).read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"|{v}" for k, v in s.labels.items() if labels is None or k in labels)
            out[key] = out.get(key, 0.0) + float(s.value)
    return out
