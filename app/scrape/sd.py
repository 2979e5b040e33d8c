"""Scrape targets from Prometheus service discovery: ``file_sd`` files and ``http_sd`` URLs.

Owns :class:`ScrapeTarget` (one URL to poll, with the node id, model,
hardware and server profile its labels give), the parsing of Prometheus'
target-group lists (``[{"targets": ["host:port", …], "labels": {…}}, …]``, JSON
or YAML), :class:`FileSource` (a watched file), :class:`HttpSource` (an
``http_sd`` URL) and sharding (:func:`shard_of`).

Guarantees:

- the conventions are Prometheus': ``__scheme__`` (default ``http``) and
  ``__metrics_path__`` (default ``/metrics``) labels shape the URL; the node id is
  the node label's value (default ``instance``), else the target's ``host:port``
  (Prometheus' own default for ``instance``);
- a bad list raises :class:`SdError` naming the file or URL, the group and what
  is wrong; callers keep their last good list when a later read fails;
- :func:`shard_of` is a stable hash of the target's URL (the same in every
  process and run), so N processes given ``I/N`` split one list without overlap;
- :meth:`FileSource.poll` reads the file only when its size, mtime or inode changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tailguard.core.contract.ids import DEFAULT_RULE, IdRule


class SdError(Exception):
    """A target list that cannot be used; the message names its source."""


@dataclass(frozen=True, slots=True)
class LabelNames:
    """Which target labels carry the node id, model, hardware and profile."""

    node: str = "instance"
    model: str = "model"
    hardware: str = "hardware"
    profile: str = "tailguard_profile"
    ids: IdRule = DEFAULT_RULE        # the rule node ids and model names must meet


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    url: str
    node_id: str
    model: str | None
    hardware: str | None
    profile: str
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """What identifies the target across list reloads (its URL and node id)."""
        return f"{self.node_id} {self.url}"


def parse_groups(data: Any, source: str, names: LabelNames = LabelNames()) -> list[ScrapeTarget]:
    """Prometheus target groups → targets, in order, duplicates (same URL) dropped."""
    if not isinstance(data, list):
        raise SdError(f"{source}: a list of target groups [{{\"targets\": [...], \"labels\": {{...}}}}], "
                      f"got {type(data).__name__}")
    out: dict[str, ScrapeTarget] = {}
    for g, group in enumerate(data):
        where = f"{source}: group {g}"
        if not isinstance(group, dict) or not isinstance(group.get("targets", []), list):
            raise SdError(f"{where}: an object with a \"targets\" list")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in labels.items()):
            raise SdError(f"{where}: \"labels\" must map label names to strings")
        for addr in group.get("targets", []):
            if not isinstance(addr, str) or not addr or "/" in addr or any(c.isspace() for c in addr):
                raise SdError(f"{where}: target {addr!r} is not host:port")
            t = _target(addr, labels, names, where)
            out.setdefault(t.url, t)
    return list(out.values())


def _target(addr: str, labels: dict[str, str], names: LabelNames, where: str) -> ScrapeTarget:
    scheme = labels.get("__scheme__", "http")
    if scheme not in ("http", "https"):
        raise SdError(f"{where}: __scheme__ {scheme!r} must be http or https")
    path = labels.get("__metrics_path__", "/metrics")
    if not path.startswith("/"):
        raise SdError(f"{where}: __metrics_path__ {path!r} must start with /")
    node_id = labels.get(names.node) or addr
    if not names.ids.ok(node_id):
        raise SdError(f"{where}: node id {node_id!r} (label {names.node!r}) breaks the id rule: {names.ids.text}")
    model = labels.get(names.model) or None
    if model is not None and not names.ids.ok(model):
        raise SdError(f"{where}: model {model!r} (label {names.model!r}) breaks the id rule: {names.ids.text}")
    public = tuple(sorted((k, v) for k, v in labels.items() if not k.startswith("__")))
    return ScrapeTarget(url=f"{scheme}://{addr}{path}", node_id=node_id, model=model,
                        hardware=labels.get(names.hardware) or None,
                        profile=labels.get(names.profile) or "auto", labels=public)


def decode(text: str, source: str) -> Any:
    """JSON, else YAML (file_sd accepts both; a ``.json`` name must be JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if source.endswith(".json"):
            raise SdError(f"{source}: not JSON ({e})") from None
    try:
        import yaml
    except ModuleNotFoundError:
        raise SdError(f"{source}: not JSON, and YAML needs PyYAML (pip install 'tailguard[worker]')") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SdError(f"{source}: neither JSON nor YAML ({' '.join(str(e).split())})") from None


def shard_of(target: ScrapeTarget, shards: int) -> int:
    """The shard (0 … ``shards``-1) that scrapes ``target``: a stable hash of its URL."""
    digest = hashlib.blake2b(target.url.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def in_shard(targets: Iterable[ScrapeTarget], index: int, shards: int) -> list[ScrapeTarget]:
    return [t for t in targets if shard_of(t, shards) == index]


class FileSource:
    """A ``file_sd`` file, read again whenever it changes."""

    def __init__(self, path: str, names: LabelNames = LabelNames()) -> None:
        self.path, self.names = path, names
        self._sig: tuple[int, int, int] | None = None

    @property
    def name(self) -> str:
        return self.path

    def poll(self) -> list[ScrapeTarget] | None:
        """The targets when the file changed since the last call (first call: always), else None."""
        try:
            st = os.stat(self.path)
            sig = (st.st_mtime_ns, st.st_size, st.st_ino)
            if sig == self._sig:
                return None
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as e:
            raise SdError(f"{self.path}: cannot read the target file ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise SdError(f"{self.path}: not UTF-8 text") from None
        targets = parse_groups(decode(text, self.path), self.path, self.names)
        self._sig = sig
        return targets


class HttpSource:
    """A Prometheus ``http_sd`` URL: a JSON list of target groups, fetched every refresh."""

    def __init__(self, url: str, names: LabelNames = LabelNames()) -> None:
        self.url, self.names = url, names

    @property
    def name(self) -> str:
        return self.url

    def parse(self, status: int, body: bytes) -> list[ScrapeTarget]:
        if status != 200:
            raise SdError(f"{self.url}: HTTP {status} (an http_sd endpoint answers 200 and a JSON list)")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SdError(f"{self.url}: not JSON ({e})") from None
        return parse_groups(data, self.url, self.names)
