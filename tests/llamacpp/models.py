"""The GGUF models of these tests: :mod:`strata_harness.gguf_model` (shared with ``strata
demo``'s llama.cpp phase and the benchmark)."""

from strata_harness.gguf_model import (
    CHAT_TEMPLATE,
    make_gemma2_gguf,
    make_gguf,
    make_mamba_gguf,
    spm_vocab,
)

__all__ = ["CHAT_TEMPLATE", "make_gemma2_gguf", "make_gguf", "make_mamba_gguf", "spm_vocab"]
