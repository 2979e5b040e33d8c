"""KEY=VALUE maps from the command line or a file (--backends, --backend-map, --server-map)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.lb import BackendsError
from tailguard.lb.maps import load_pairs, parse_pairs


def test_inline_pairs() -> None:
    assert load_pairs(" a = http://x:1 ,b=http://y:2", flag="--backends") == {"a": "http://x:1", "b": "http://y:2"}


def test_file_with_lines_comments_and_commas(tmp_path: Path) -> None:
    f = tmp_path / "backends.txt"
    f.write_text("# fleet\nnode-1=http://10.0.0.1:8000  # rack 1\n\nnode-2=http://10.0.0.2:8000,node-3=http://h:3\n")
    assert load_pairs(str(f), flag="--backends") == {
        "node-1": "http://10.0.0.1:8000", "node-2": "http://10.0.0.2:8000", "node-3": "http://h:3"}


def test_json_file(tmp_path: Path) -> None:
    f = tmp_path / "map.json"
    f.write_text('{"llama": "be_llama", "bge": "be_bge"}')
    assert load_pairs(str(f), flag="--backend-map") == {"llama": "be_llama", "bge": "be_bge"}


@pytest.mark.parametrize(
    ("arg", "needle"),
    [("a=1,a=2", "twice"), ("a=", "KEY=VALUE"), ("=x", "KEY=VALUE"), ("a", "neither"), (",", "neither"),
     ("a=1,b", "KEY=VALUE")],
)
def test_bad_input_names_flag_and_entry(arg: str, needle: str) -> None:
    with pytest.raises(BackendsError, match=needle) as e:
        load_pairs(arg, flag="--server-map")
    assert "--server-map" in str(e.value)


def test_bad_json_and_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_text('{"a": 1}')
    with pytest.raises(BackendsError, match="non-empty strings"):
        load_pairs(str(f), flag="--backend-map")
    g = tmp_path / "empty"
    g.write_text("# nothing\n")
    with pytest.raises(BackendsError, match="no KEY=VALUE"):
        load_pairs(str(g), flag="--backend-map")


def test_parse_pairs_of_empty_text_is_empty() -> None:
    assert parse_pairs("", flag="x") == {}
