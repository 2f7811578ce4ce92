"""The vocabulary a made-up prompt draws from: read from the served model's own files, never guessed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixtop.incident.replay.vocab import SIM_VOCABULARY, VocabError, Vocabulary, for_server, from_model_dir


def model_dir(root: Path, *, vocab_size: int = 2048, tokenizer_size: int | None = None, **config: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"vocab_size": vocab_size, "eos_token_id": [2, 7]} | config))
    if tokenizer_size is not None:
        tok = {"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(3, tokenizer_size - 1)}},
               "added_tokens": [{"id": 0, "content": "<pad>", "special": True},
                                {"id": 1, "content": "<s>", "special": True},
                                {"id": tokenizer_size - 1, "content": "<|im_end|>", "special": True}]}
        (root / "tokenizer.json").write_text(json.dumps(tok))
    return root


def test_a_model_folder_gives_its_size_cut_to_the_tokenizer_and_its_special_ids(tmp_path):
    vocab = from_model_dir(model_dir(tmp_path / "m", vocab_size=2048, tokenizer_size=2000, bos_token_id=1))
    assert vocab is not None and vocab.size == 2000
    assert vocab.special == (0, 1, 2, 7, 1999)
    assert "tokenizer.json" in vocab.source and "2,048" in vocab.source
    ids = [vocab.nth(i) for i in range(vocab.usable)]
    assert len(ids) == 1995 and not set(ids) & set(vocab.special) and ids == sorted(ids) and ids[-1] == 1998


def test_a_multimodal_config_names_its_vocabulary_under_text_config(tmp_path):
    root = tmp_path / "vl"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 151936, "eos_token_id": 151645}}))
    vocab = from_model_dir(root)
    assert vocab is not None and vocab.size == 151936 and vocab.special == (151645,)


def test_the_server_info_model_path_or_the_hub_cache_snapshot_is_read(tmp_path):
    local = model_dir(tmp_path / "local", vocab_size=4096)
    assert for_server({"model_path": str(local)}).size == 4096
    hub = tmp_path / "hf" / "hub"
    model_dir(hub / "models--org--tiny" / "snapshots" / "abc123", vocab_size=32000)
    assert for_server({"model_path": "org/tiny"}, env={"HF_HUB_CACHE": str(hub)}).size == 32000


def test_an_unknown_model_is_one_line_saying_what_to_pass_and_the_simulator_has_its_own(tmp_path):
    with pytest.raises(VocabError, match=r"no config.json with vocab_size for the model 'org/absent'.*--vocab-size N"):
        for_server({"model_path": "org/absent"}, env={"HF_HUB_CACHE": str(tmp_path)})
    with pytest.raises(VocabError, match=r"the server's model is unknown \(no /server_info answered\)"):
        for_server(None)
    assert for_server({"model_path": "radixtop/sim-model"}, kind="radixtop-sim") is SIM_VOCABULARY
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    with pytest.raises(VocabError):
        for_server({"model_path": str(garbage)})


def test_a_vocabulary_with_nothing_left_to_use_is_refused():
    with pytest.raises(VocabError, match="leaves nothing to use"):
        Vocabulary(3, (0, 1))
    assert Vocabulary(10, (3, 99)).special == (3,)
