"""Where a store's warnings and INFO lines go: the ``logging`` module, and the engine's
``warn=`` callback when it gave one.

Every line a store says is a record of the logger ``stratastore`` (:data:`LOGGER`): at
``WARNING`` what went wrong or was lowered (a level refused a write, the ladder stopped below
damage, a budget lowered to fit the machine), at ``INFO`` the admission lines (a park or a
read admitted under the transient RAM floor, a park skipped by the physical RAM admission)
and the park target ``park = auto`` chose. An engine routes them with its own handlers
(``logging.getLogger("stratastore").addHandler(...)``, or its logging config); with none, the
warnings reach stderr (Python's last-resort handler) and the INFO lines stay quiet. The
``warn=`` callback of ``Store.open`` is kept for engines that want every line as a string: when
given it is called with each line, warnings and INFO lines alike, and the record is emitted
either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["LOGGER", "Voice"]

#: the logger every store's lines go to
LOGGER = logging.getLogger("stratastore")


class Voice:
    """A store's way to say a line (see the module): called with a warning, or
    :meth:`info` with an INFO line; each is a record of ``logger`` and, when the engine gave
    a ``warn`` callback, a call of it."""

    def __init__(
        self, warn: Callable[[str], None] | None = None, logger: logging.Logger = LOGGER
    ) -> None:
        self.callback = warn
        self.logger = logger

    def __call__(self, line: str) -> None:
        """Say a warning."""
        self.logger.warning(line)
        if self.callback is not None:
            self.callback(line)

    def info(self, line: str) -> None:
        """Say an INFO line (an admission, the park target ``auto`` chose)."""
        self.logger.info(line)
        if self.callback is not None:
            self.callback(line)
