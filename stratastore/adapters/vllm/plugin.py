"""stratastore's vLLM general plugin (the ``vllm.general_plugins`` entry point): vLLM calls
:func:`register` early in each of its processes (the API server, the engine core, each
worker), before the engine core starts its workers. It only keeps out of vLLM's log a warning
the connector's own setting causes (:func:`stratastore.adapters.vllm.connector`'s
``_keep_vllms_threads``); it changes nothing when the connector is not configured. No vLLM
import."""

from __future__ import annotations

import logging

from stratastore.io.system import env_var

__all__ = ["OWN_RESERVATION_ENV", "RESERVED_CPU_ENV", "OwnReservation", "register"]

#: vLLM's CPU setting of the cores it keeps from its workers' OMP threads
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
#: the value of :data:`RESERVED_CPU_ENV` the connector set (inherited by vLLM's processes)
OWN_RESERVATION_ENV = "STRATA_VLLM_RESERVED_CPU"
#: the logger of vLLM's CPU thread placement (``vllm/utils/ompmultiprocessing.py``)
_OMP_LOGGER = "vllm.utils.ompmultiprocessing"


class OwnReservation(logging.Filter):
    """Drops vLLM's warning that :data:`RESERVED_CPU_ENV` is below the reservation vLLM makes
    with a connector, when the connector set it to vLLM's reservation without one: that is
    the point, not a mistake of the user's (a value the user set is warned about as ever)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ours = env_var(OWN_RESERVATION_ENV)
        return not (
            ours is not None
            and ours == env_var(RESERVED_CPU_ENV)
            and RESERVED_CPU_ENV in record.getMessage()
        )


def register() -> None:
    """Install :class:`OwnReservation` on vLLM's thread-placement logger, once per process."""
    logger = logging.getLogger(_OMP_LOGGER)
    if not any(isinstance(f, OwnReservation) for f in logger.filters):
        logger.addFilter(OwnReservation())
