"""Scraped servers: nodes judged from the latency histograms their ``/metrics`` already export.

``tailguard scrape`` reads vLLM, SGLang, TGI, Triton and Dynamo (or any server a mapping file
describes) and publishes histogram events to ``latency-events`` (docs/contracts.md); stage 1
and stage 2 judge them like any other pair. The package keeps the pure part apart from I/O:

* :mod:`.profiles` — which series of which server carry request latency (built in, or a file);
* :mod:`.convert` — exposition text → histogram events: deltas of cumulative buckets, restarts
  as a new ``instance``; also the captures ``tailguard replay`` reads. No I/O, no clock;
* :mod:`.sd` — targets from Prometheus ``file_sd`` files and ``http_sd`` URLs;
* :mod:`.bridge` — the polling loop (a timeout per target, its own metrics, sharding);
* :mod:`.run` — the command: settings, Kafka producer, start-up errors;
* :mod:`.config` — the ``TAILGUARD_SCRAPE_*`` settings' rules.

Per-server metrics, buckets and what they can resolve: docs/scrape.md.
"""
