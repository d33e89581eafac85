"""The library's result files are written whole or not at all."""

import json
import os

import numpy as np
import pytest

from sparsebalance_jax.jsonfile import write_json, write_text


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / "result.json")
    write_json(path, {"rows": [1, 2]})
    with pytest.raises(TypeError):  # fails partway: the first row serialises, the second not
        write_json(path, {"rows": [1, np.float32(2.0)]})
    with open(path) as f:
        assert json.load(f) == {"rows": [1, 2]}
    assert os.listdir(tmp_path) == ["result.json"]  # no temporary file left behind
    write_json(path, {"rows": [3]}, indent=1)
    with open(path) as f:
        assert json.load(f) == {"rows": [3]}


def test_text_is_replaced_whole(tmp_path):
    path = str(tmp_path / "table.md")
    write_text(path, "| a |\n")
    with pytest.raises(TypeError):  # not text: nothing written, the old table kept
        write_text(path, b"| b |\n")
    with open(path) as f:
        assert f.read() == "| a |\n"
    assert os.listdir(tmp_path) == ["table.md"]
    write_text(path, "| c |\n")
    with open(path) as f:
        assert f.read() == "| c |\n"
