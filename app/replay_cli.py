"""``tailguard replay FILE|-``: the command line around :func:`tailguard.core.replay.replay.replay`.

Usage::

    tailguard replay [--set KEY=VALUE]... [--summary] [--progress] [--format auto|events|capture]
                     [--node-label L] [--hardware-label L] [--model-label L] [--profile P] FILE|-

Owns what the pure core may not touch: argparse, the file (or standard input; gzip is
decompressed on the fly), stdout and stderr. The input is JSON lines of latency events (any
form of the contract) or captured scrapes (``/federate`` text with a node label and a
timestamp on every sample), turned into histogram events by
:func:`tailguard.scrape.convert.events_from_capture`; ``--format auto`` tells them apart by the
first line that is not blank. The replay's output lines go to stdout unchanged.

Guarantees: stderr gets a one-line summary at the end (``--summary`` adds a per-pair table and
each model's cluster P50/P99; ``--progress`` a line every ``PROGRESS_EVERY_LINES`` lines; in
full: docs/replay.md). Exit codes: 0 — replayed (bad lines do not change it); 1 — the file
cannot be read, or a capture cannot be converted (the message names it and the block); 2 —
bad command line or a bad ``--set`` (the message names the setting and what is allowed).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any, cast

from tailguard.collector import collector_paused
from tailguard.core.contract.config import SettingError, field_names
from tailguard.core.judge.hist_resolution import summary_text
from tailguard.core.replay.detector import Detector
from tailguard.core.replay.replay import ReplayStats, replay
from tailguard.core.window.quantiles import digest_from_dict, digest_quantiles
from tailguard.scrape.convert import ScrapeError, events_from_capture
from tailguard.settings import parse_set
from tailguard.text import printable

UTF8_BOM = b"\xef\xbb\xbf"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard replay",
        description="Run the detector offline over a JSON-lines file of latency events, in event "
                    "time. One JSON line per health transition (routing-weight change, fleet "
                    "event) on stdout.")
    p.add_argument("file", metavar="FILE|-", help="JSON-lines trace; - reads standard input")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a detector setting (repeatable): " + ", ".join(field_names()))
    p.add_argument("--summary", action="store_true",
                   help="print a final per-(node, model) table to stderr")
    p.add_argument("--progress", action="store_true", default=None,
                   help="print progress to stderr (default: when stderr is a terminal)")
    p.add_argument("--format", choices=("auto", "events", "capture"), default="auto",
                   help="events: JSON lines of latency events (histogram events included); capture:"
                        " captured scrapes (/federate text, ms timestamps); auto (default): by the"
                        " first line")
    p.add_argument("--node-label", default="instance",
                   help="capture: the label naming each target's node (default instance)")
    p.add_argument("--hardware-label", default="hardware",
                   help="capture: the label naming its hardware class (default hardware)")
    p.add_argument("--model-label", default="model",
                   help="capture: the label naming the model of servers without one, TGI (default model)")
    p.add_argument("--profile", default="auto",
                   help="capture: vllm, sglang, tgi, triton, dynamo or auto (default: from the metric names)")
    return p


# Unit of each signal's quantiles, and the digits worth printing (tailguard.core.window.signals).
_SIGNAL_UNITS: dict[str | None, tuple[str, int]] = {
    "latency": ("µs", 0), "tpot": ("µs/token", 1), "normalized": ("× expected", 2),
    # Histogram pairs (tailguard.core.window.hist_window): interpolated between bucket bounds, for people.
    "e2e_hist": ("µs, interpolated", 0), "ttft_hist": ("µs, interpolated", 0),
    "itl_hist": ("µs/token, interpolated", 0)}


def _status_table(det: Detector) -> str:
    """``--summary``: the judged signal's quantiles (with units) next to the raw latency's."""
    statuses = det.statuses()
    signals = {s.signal for s in statuses}
    one = next(iter(signals)) if len(signals) == 1 else None

    def unit(signal: str | None) -> str:
        return _SIGNAL_UNITS.get(signal, ("?", 2))[0]

    head = f" ({unit(one)})" if one is not None else ""
    rows = [("model", "node", "state", "routed", "since", "reason", "signal", f"signal p50{head}",
             f"signal p99{head}", "signal p99/p50", "p50 µs", "p99 µs", "p99/p50", "samples")]
    for s in statuses:
        digits = _SIGNAL_UNITS.get(s.signal, ("?", 2))[1]
        label = s.signal or "-"
        if one is None and s.signal is not None:
            label += f" ({unit(s.signal)})"
        rows.append((printable(s.model), printable(s.node_id), str(s.state), "yes" if s.routed else "no",
                     f"{s.since_ts:.0f}", s.reason, label, _num(s.p50, digits), _num(s.p99, digits),
                     _num(s.ratio, 2), _num(s.latency_p50_us), _num(s.latency_p99_us),
                     _num(s.latency_ratio, 2), str(s.samples)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def fleet_lines(det: Detector) -> list[str]:
    """``--summary``: each model's cluster-wide raw-latency P50/P99 at the last tick."""
    out = []
    for model in sorted(det.routing().keys() | det.fleet_digests.keys()):
        d = det.fleet_digests.get(model)
        q = None if d is None else digest_quantiles(digest_from_dict(d), (0.5, 0.99))
        if d is None or q is None:
            out.append(f"model {model}: cluster P50 -, P99 - (no judged samples at the last tick)")
            continue
        out.append(f"model {model}: cluster P50 {q[0] / 1e3:.2f} ms, P99 {q[1] / 1e3:.2f} ms "
                   f"(t-digest over {d.get('nodes', 0)} nodes)")
    return out


def _is_capture(stream: IO[bytes]) -> bool:
    """Whether the first line that is not blank looks like Prometheus text, not an event."""
    peek = getattr(stream, "peek", None)       # BufferedReader and GzipFile (_maybe_gunzip)
    head: bytes = peek(65536) if peek is not None else b""
    first = next((ln.strip() for ln in head.splitlines() if ln.strip()), b"")
    return bool(first) and not first.startswith(b"{") and not first.startswith(b"\xf5TG")


def _capture_events(stream: IO[bytes], args: argparse.Namespace) -> Iterator[str]:
    """A capture's histogram events as JSON lines (converted as read; see the module docstring)."""
    text = (line.decode("utf-8", "replace") for line in stream)
    for ev in events_from_capture(text, node_label=args.node_label, hardware_label=args.hardware_label,
                                  model_label=args.model_label, profile=args.profile):
        yield json.dumps(ev)


def _num(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse_set(args.overrides)
    except SettingError as e:
        print(f"tailguard replay: {e}", file=sys.stderr)
        return 2
    name = "standard input" if args.file == "-" else args.file
    try:
        stream: IO[bytes] = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as e:
        print(f"tailguard replay: cannot read {name}: {e.strerror or e}", file=sys.stderr)
        return 1
    try:
        stream = _maybe_gunzip(stream)
    except OSError as e:
        print(f"tailguard replay: cannot read {name}: {e.strerror or e}", file=sys.stderr)
        return 1
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    out = sys.stdout
    write = out.write

    def emit(line: str) -> None:
        write(line)
        write("\n")

    def progress(st: ReplayStats) -> None:
        at = ("" if st.first_ts is None or st.last_ts is None
              else f", event time +{st.last_ts - st.first_ts:.0f} s")
        print(f"replay: {st.lines} lines, {st.events} events{at}, {st.ticks} ticks, "
              f"{st.transitions} transitions", file=sys.stderr)

    try:
        with stream:
            lines: Iterable[bytes | str] = stream
            if args.format == "capture" or (args.format == "auto" and _is_capture(stream)):
                lines = _capture_events(stream, args)
            det, stats = replay(lines, settings, emit, progress=progress if show_progress else None,
                                detector=Detector(settings, pause_collector=collector_paused))
    except OSError as e:
        print(f"tailguard replay: cannot read {name}: {e.strerror or e}", file=sys.stderr)
        return 1
    except ScrapeError as e:
        print(f"tailguard replay: {name} is not a capture tailguard can read: {e}", file=sys.stderr)
        return 1
    out.flush()
    print(stats.summary() + summary_text(det.unresolved), file=sys.stderr)
    if args.summary:
        print(_status_table(det), file=sys.stderr)
        for line in fleet_lines(det):
            print(line, file=sys.stderr)
    return 0


def _maybe_gunzip(stream: IO[bytes]) -> IO[bytes]:
    """A gzip-compressed trace (magic bytes 1f 8b) is decompressed on the fly; a UTF-8
    byte-order mark at the start (Windows tools write one) is skipped."""
    buffered: Any = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(stream)
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        buffered = gzip.GzipFile(fileobj=buffered, mode="rb")
    if buffered.peek(3)[:3] == UTF8_BOM:
        buffered.read(3)
    return cast(IO[bytes], buffered)
