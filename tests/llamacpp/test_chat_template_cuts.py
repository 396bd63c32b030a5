"""Message ends from the chat template the GGUF carries: a park with ``messages`` keeps each
message's end as a checkpoint, so a chat edited in its last message resumes where that message
starts, the system prompt pinned; a GGUF with no template is refused with a ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .engine import load

CHAT = [
    {"role": "system", "content": "You are a terse agent. Answer in one line."},
    {"role": "user", "content": "list the files in /tmp"},
    {"role": "assistant", "content": "a.txt b.txt"},
    {"role": "user", "content": "now delete b.txt please"},
]


def tokens(llm: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat's tokens as ``create_chat_completion`` makes them (a Jinja2 template adds its
    own special tokens: no BOS is added)."""
    text = render(llm, messages).encode()
    return [int(t) for t in llm.tokenize(text, add_bos=False, special=True)]


def render(llm: Any, messages: list[dict[str, str]]) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    fmt = Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"],
        eos_token="</s>",
        bos_token="<s>",
        add_generation_prompt=False,
    )
    return fmt(messages=messages).prompt


def test_cuts_are_message_ends_that_prefix_the_tokens(tiny: Path) -> None:
    from stratastore.adapters.llamacpp import cuts_from_chat_template

    llm = load(tiny)
    ids = tokens(llm, CHAT)
    cuts = cuts_from_chat_template(llm, CHAT, ids)
    assert len(cuts) == len(CHAT) and cuts == sorted(cuts) and cuts[-1] == len(ids)
    for i, n in enumerate(cuts):
        assert ids[:n] == tokens(llm, CHAT[: i + 1])
    # tokens that are not this chat's: no cut where they differ
    other = [*ids[: cuts[1]], 5, *ids[cuts[1] + 1 :]]
    assert cuts_from_chat_template(llm, CHAT, other) == cuts[:2]


def test_an_edit_of_the_last_message_resumes_where_it_starts(tiny: Path, tmp_path: Path) -> None:
    from stratastore.adapters.llamacpp import LlamaCppStore, cuts_from_chat_template

    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path), "cold_mib": 64}
    llm = load(tiny)
    ids = tokens(llm, CHAT)
    llm.eval(ids)
    system = cuts_from_chat_template(llm, CHAT, ids)[0]
    with LlamaCppStore.open(llm, cfg) as s:  # page_resume off: only checkpoints are restored
        s.park("agent", messages=CHAT, pinned=[system])
    edited = [*CHAT[:3], {"role": "user", "content": "no, keep b.txt and delete a.txt"}]
    fresh = load(tiny)
    with LlamaCppStore.open(fresh, cfg) as s:
        n = s.restore(tokens(fresh, edited))
    assert n == cuts_from_chat_template(llm, CHAT, ids)[2]  # the end of the assistant's reply


def test_a_model_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    from stratastore.adapters.llamacpp import cuts_from_chat_template
    from stratastore.errors import ConfigError

    from .models import make_gguf

    llm = load(make_gguf(tmp_path / "plain.gguf", seed=2))
    llm.metadata.pop("tokenizer.chat_template", None)
    with pytest.raises(ConfigError, match="chat_template"):
        cuts_from_chat_template(llm, CHAT)
