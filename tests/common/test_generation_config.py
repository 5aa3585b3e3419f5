"""EOS ids and sampling defaults, read from a model folder's two JSON files."""
from __future__ import annotations

import json

from common.generation_config import load_eos_token_ids, load_generation_defaults


def test_eos_ids_come_from_both_files(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert load_eos_token_ids(tmp_path) == {2}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2], "temperature": 0.7}))
    assert load_eos_token_ids(tmp_path) == {2, 7}
    assert load_generation_defaults(tmp_path) == {"temperature": 0.7}


def test_a_folder_without_the_files_has_no_eos_and_no_defaults(tmp_path):
    assert load_eos_token_ids(tmp_path) == set() and load_generation_defaults(tmp_path) == {}
