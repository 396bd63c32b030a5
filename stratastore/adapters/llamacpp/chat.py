"""Where a conversation's messages end, in tokens, from the chat template its GGUF carries
(``tokenizer.chat_template``), rendered and tokenized as ``Llama.create_chat_completion`` does
with that template (a ``Llama`` given another ``chat_format`` or handler renders otherwise: its
tokens then give fewer cuts, never a wrong one): the cuts a park keeps (each message a
segment, the system prompt's end the length to pin; docs/engine.md, "llama.cpp")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stratastore.adapters.chat_cuts import message_ends
from stratastore.errors import ConfigError

__all__ = ["cuts_from_chat_template"]


def _token(llm: Any, token_id: int) -> str:
    if token_id < 0:
        return ""
    return bytes(llm.detokenize([token_id], special=True)).decode("utf-8", errors="ignore")


def cuts_from_chat_template(
    llm: Any, messages: Sequence[Mapping[str, Any]], token_ids: Sequence[int] | None = None
) -> list[int]:
    """The lengths of the chat template rendered on ``messages[:i]`` for ``i = 1 ..
    len(messages)``, tokenized by ``llm``'s model, ascending: where each message ends and the
    next one's opener starts. The first is the system prompt's end when ``messages[0]`` is
    one. With ``token_ids`` (the conversation as parked) a length counts only where its
    tokens are a prefix of them: a template that rewrites earlier messages once later ones
    exist, a tokenizer that merges across the boundary, or a template that raises on a prefix
    gives no cut there, never a wrong one. :class:`ConfigError` when the GGUF carries no chat
    template."""
    from jinja2 import TemplateError
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = getattr(llm, "metadata", {}).get("tokenizer.chat_template")
    if not template:
        raise ConfigError(
            "the model's GGUF carries no tokenizer.chat_template: message ends come from it; "
            "pass checkpoints= instead"
        )
    fmt = Jinja2ChatFormatter(
        template=template,
        eos_token=_token(llm, llm.token_eos()),
        bos_token=_token(llm, llm.token_bos()),
        add_generation_prompt=False,
    )

    def render(i: int) -> list[int] | None:
        try:
            out = fmt(messages=list(messages[:i]))
        except (ValueError, TemplateError):  # a template that refuses this prefix: no cut
            return None
        tokens = llm.tokenize(out.prompt.encode(), add_bos=not out.added_special, special=True)
        return [int(t) for t in tokens]

    ids = None if token_ids is None else np.asarray(token_ids, dtype=np.int64)
    return message_ends(render, len(messages), ids)
