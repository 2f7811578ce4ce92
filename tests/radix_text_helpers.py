"""A real tokenizer.json made in the test (a byte-level BPE trained with the `tokenizers` library,
as tests/sglang/tiny_model.py makes the tiny model's), and radix trees whose heads are its ids."""

from __future__ import annotations

from pathlib import Path

from pane_helpers import make_snapshot

from radixtop.schema import MAX_HEAD_TOKENS, NodeRow, Snapshot

SYSTEM = "You are a helpful assistant.\nAnswer in one line."
CORPUS = [SYSTEM, "What is a radix tree? A prefix tree.", "Hello world, hello tokens", "tab\there\r\n"] * 20


def make_tokenizer(folder: Path) -> Path:
    """folder/tokenizer.json: a small byte-level BPE with <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def encode(path: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).encode(text).ids


def text_snapshot(path: Path, **changes) -> Snapshot:
    """root -> 1 (the system prompt, 64 tokens more than its head) -> 2 (a question); root -> 3
    (text with an escape sequence in it)."""
    sys_ids = encode(path, SYSTEM)
    question = encode(path, "What is a radix tree?")
    hostile = encode(path, "Hello\x1b[31m world")

    def row(nid: int, parent: int, ids: list[int], tokens: int, children: int = 0) -> NodeRow:
        return NodeRow(id=nid, parent=parent, tokens=tokens, lock_ref=0, evicted=False, hit_count=2,
                       last_access=100.0, children=children, subtree_tokens=tokens,
                       head=tuple(ids[:MAX_HEAD_TOKENS]))

    nodes = (
        row(0, -1, [], 0, children=2),
        row(1, 0, sys_ids, len(sys_ids) + 64, children=1),
        row(2, 1, question, len(question)),
        row(3, 0, hostile, len(hostile)),
    )
    return make_snapshot(nodes=nodes, **changes)
