"""Node ids and model names: the rule they must meet, and the allowlist.

Owns what a node id or model name may be. The ids come from whoever can write to
``latency-events`` and end up in routing sets, Redis keys, log lines and terminals, so the
decoder (:mod:`tailguard.core.contract.events`) refuses every event whose ids break the rule.

Guarantees:

* :data:`DEFAULT_RULE`: 1 to 128 characters of printable ASCII 0x21-0x7E except ``|`` (the
  ``node_id|model`` key separator). It takes pod names, host names, ``10.0.0.5:8000``,
  ``[fe80::1]:8000``, ``meta-llama/Llama-3.1-8B-Instruct``, ``org:model@rev``.
  ``TAILGUARD_ID_PATTERN`` (a regular expression, matched whole) replaces it; any rule also
  requires 1 to :data:`MAX_NAME_CHARS` characters.
* :meth:`IdRule.ok` is pure and cheap: accepted ids are remembered (at most
  :data:`MAX_KNOWN`; emptied when full), so each distinct id runs the pattern once.
* :class:`Allowlist` answers whether a node id is registered (a set of ids and/or a
  pattern) and whether a model name is (a set and/or a pattern; no model rule: every
  model); loading it (Redis, a file, settings) is the streaming layer's job.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from tailguard.core.contract.errors import BadEvent

#: Any name of the contract (node_id, model, hardware, instance): at most this many characters.
MAX_NAME_CHARS: Final = 256
#: The default id rule; ``TAILGUARD_ID_PATTERN`` replaces it.
DEFAULT_PATTERN: Final = r"[\x21-\x7b\x7d\x7e]{1,128}"
DEFAULT_RULE_TEXT: Final = "1-128 characters of printable ASCII 0x21-0x7E except '|'"
#: Accepted ids remembered per rule before the memory is emptied (a flood's one-off ids are
#: kept alive only as long as this many fit; the regular expression is cheap on a miss).
MAX_KNOWN: Final = 4096


class IdRule:
    """What a node id and a model name must match (module docstring)."""

    __slots__ = ("_known", "_match", "pattern", "text")

    def __init__(self, pattern: str = "") -> None:
        """``pattern`` "" is the default rule; a bad regular expression raises ValueError."""
        self.pattern = pattern or DEFAULT_PATTERN
        try:
            self._match = re.compile(self.pattern).fullmatch
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"not a regular expression: {e}") from None
        self.text = DEFAULT_RULE_TEXT if not pattern else \
            f"matching {pattern!r:.80} (TAILGUARD_ID_PATTERN), at most {MAX_NAME_CHARS} characters"
        self._known: set[str] = set()

    def ok(self, name: str) -> bool:
        """True when ``name`` meets the rule."""
        if name in self._known:
            return True
        if not 0 < len(name) <= MAX_NAME_CHARS or self._match(name) is None:
            return False
        if len(self._known) >= MAX_KNOWN:
            self._known.clear()
        self._known.add(name)
        return True

    def forget(self) -> None:
        """Empty the memory of accepted ids (after a flood's ids were forgotten)."""
        self._known = set()

    def error(self, key: str, name: str) -> BadEvent:
        """The dead-letter reason for ``name`` in ``key`` (node_id or model) breaking the rule."""
        shown = repr(name[:60]) + ("…" if len(name) > 60 else "")
        return BadEvent(f"bad_{key}", f"{key} {shown} ({len(name)} characters) breaks the id rule: {self.text}"
                        " (docs/contracts.md)", field=key)


@functools.lru_cache(maxsize=8)
def rule(pattern: str = "") -> IdRule:
    """The shared :class:`IdRule` of ``pattern`` (so its memory of accepted ids is shared)."""
    return IdRule(pattern)


DEFAULT_RULE: Final = rule("")


def _compile(pattern: str) -> Callable[[str], object] | None:
    if not pattern:
        return None
    try:
        return re.compile(pattern).fullmatch
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"not a regular expression: {e}") from None


@dataclass(frozen=True, slots=True)
class Allowlist:
    """Registered node ids: in ``ids``, or matching ``pattern`` (whole) — checked when
    ``nodes_on``; registered models: in ``models`` or matching ``model_pattern`` — checked
    when either is given. Pure."""

    ids: frozenset[str] = frozenset()
    pattern: str = ""
    models: frozenset[str] = frozenset()
    model_pattern: str = ""
    nodes_on: bool = True
    _match: Callable[[str], object] | None = field(default=None, init=False, repr=False,
                                                   compare=False)
    _model_match: Callable[[str], object] | None = field(default=None, init=False, repr=False,
                                                         compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_match", _compile(self.pattern))
        object.__setattr__(self, "_model_match", _compile(self.model_pattern))

    @property
    def models_on(self) -> bool:
        return bool(self.models or self.model_pattern)

    def allows(self, node_id: str) -> bool:
        return node_id in self.ids or (self._match is not None and self._match(node_id) is not None)

    def allows_model(self, model: str) -> bool:
        if not self.models_on or model in self.models:
            return True
        return self._model_match is not None and self._model_match(model) is not None

    def check(self, node_id: str, model: str) -> None:
        """Raise :class:`BadEvent` (``not_allowlisted``) for a node id or model not registered."""
        if self.nodes_on and not self.allows(node_id):
            raise self.error(node_id)
        if not self.allows_model(model):
            shown = repr(model[:60]) + ("…" if len(model) > 60 else "")
            raise BadEvent("not_allowlisted", f"model {shown} is not on the model allowlist"
                           f" ({len(self.models)} registered names"
                           + (f", pattern {self.model_pattern!r:.60}" if self.model_pattern else "")
                           + "; TAILGUARD_ALLOWLIST_MODELS, TAILGUARD_ALLOWLIST_MODEL_PATTERN;"
                           " docs/operating.md#allowlist)", field="model")

    def error(self, node_id: str) -> BadEvent:
        shown = repr(node_id[:60]) + ("…" if len(node_id) > 60 else "")
        return BadEvent("not_allowlisted", f"node_id {shown} is not on the allowlist"
                        f" ({len(self.ids)} registered ids"
                        + (f", pattern {self.pattern!r:.60}" if self.pattern else "")
                        + "; docs/operating.md#allowlist)", field="node_id")

    @classmethod
    def parse_lines(cls, lines: Iterable[str], pattern: str = "", *,
                    models: Iterable[str] = (), model_pattern: str = "",
                    nodes_on: bool = True) -> Allowlist:
        """One id per line; blank lines and ``#`` comments are skipped, spaces stripped."""
        ids = (line.split("#", 1)[0].strip() for line in lines)
        return cls(frozenset(i for i in ids if i), pattern,
                   frozenset(m.strip() for m in models if m.strip()), model_pattern, nodes_on)
