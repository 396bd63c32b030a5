"""Where each message of a chat ends, in tokens, from a chat template: what every adapter's
``cuts_from_chat_template`` computes once it has rendered and tokenized a prefix of the chat
its engine's way (transformers' tokenizer, the chat template a GGUF carries)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["message_ends"]


def message_ends(
    render: Callable[[int], Sequence[int] | None],
    messages: int,
    token_ids: npt.NDArray[np.integer] | None = None,
) -> list[int]:
    """The lengths of ``render(i)`` (the tokens of the first ``i`` messages rendered by the
    template; None: the template refuses that prefix) for ``i = 1 .. messages``, ascending,
    each kept only when it is longer than the one before and, with ``token_ids`` (the
    conversation as parked), its tokens are a prefix of them: a template that rewrites earlier
    messages once later ones exist, or a tokenizer that merges across the boundary, gives no
    cut there, never a wrong one."""
    cuts: list[int] = []
    for i in range(1, messages + 1):
        rendered = render(i)
        if rendered is None:
            continue
        n = len(rendered)
        if n == 0 or (cuts and n <= cuts[-1]):
            continue
        if token_ids is not None and (
            n > len(token_ids) or not np.array_equal(token_ids[:n], rendered)
        ):
            continue
        cuts.append(n)
    return cuts
