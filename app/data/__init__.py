"""Data files shipped with the package (see README.md here for sources and licence).

:func:`load_request_sizes` reads an Azure LLM inference trace as an
``(n, 2)`` float64 array of ``[input_tokens, output_tokens]`` in trace
order. Reading happens only when called (this is not part of the pure core).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import numpy as np
import numpy.typing as npt

TRACES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}


@cache
def _load(name: str) -> npt.NDArray[np.float64]:
    if name not in TRACES:
        raise ValueError(f"unknown request-size trace {name!r}: expected one of {', '.join(TRACES)}")
    text = resources.files(__package__).joinpath(TRACES[name]).read_text(encoding="utf-8")
    rows = [line.rsplit(",", 2)[-2:] for line in text.splitlines()[1:] if line.strip()]
    arr = np.array(rows, dtype=np.float64)
    arr.setflags(write=False)
    return arr


def load_request_sizes(name: str) -> npt.NDArray[np.float64]:
    """``[input_tokens, output_tokens]`` per request of trace ``name`` ("conv" or "code")."""
    return _load(name)
