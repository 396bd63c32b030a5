"""Small random Llama models made at test time for vLLM on the CPU (nothing is downloaded).

``initializer_range=0.1`` so that greedy decoding follows the prompt (at the default 0.02 a deep
random Llama decodes one token forever, and "tokens identical" would prove nothing). The
tokenizer is a 1,000-token byte-level BPE trained in a second; prompts are given to vLLM as
token ids, so its vocabulary only has to cover them."""

from __future__ import annotations

import json
from pathlib import Path


def make_llama(
    dir: Path,
    *,
    layers: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    heads: int = 4,
    intermediate: int = 256,
    vocab: int = 1000,
    seed: int = 0,
    max_positions: int = 4096,
) -> Path:
    """A random ``LlamaForCausalLM`` in bfloat16 saved under ``dir`` with its tokenizer;
    returns ``dir``. The same arguments give the same weights (``seed``)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dir.mkdir(parents=True, exist_ok=True)
    if (dir / "config.json").exists():
        return dir
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=heads * head_dim,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(dir)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([" ".join(f"word{i}" for i in range(400))] * 4, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(dir)
    (dir / "made.json").write_text(json.dumps({"layers": layers, "seed": seed}))
    return dir
