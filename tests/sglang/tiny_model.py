"""A tiny random-weight Llama for a real SGLang server on the CPU: `python tiny_model.py DIR`.

Writes DIR/config.json (2 layers, hidden 128, 4 heads, 2 KV heads, a vocabulary of 2,048, 4,096
positions, bf16; served with --load-format dummy, so no weights are needed) and a byte-level BPE
tokenizer trained here with the `tokenizers` library on a deterministic corpus, so the model has a
real tokenizer.json with special tokens (<pad>=0, <s>=1, </s>=2) and nothing is fetched.
Run with the real-SGLang environment's Python (it has `tokenizers`).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 2048
SPECIAL = ["<pad>", "<s>", "</s>"]


def corpus(lines: int = 4000) -> list[str]:
    rng = random.Random(2048)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(12)) for _ in range(lines)]


def make(root: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    }
    (root / "config.json").write_text(json.dumps(config, indent=2))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "bos_token": "<s>",
        "eos_token": "</s>", "model_max_length": 4096,
    }))


if __name__ == "__main__":
    make(Path(sys.argv[1]))
