"""vLLM's warning about ``VLLM_CPU_NUM_OF_RESERVED_CPU`` is left out of its log only when the
connector set that variable (to vLLM's reservation without a connector); a value the user set
is warned about as vLLM warns; the filter is installed once per process, as vLLM's general
plugin (``vllm.general_plugins``), without vLLM."""

from __future__ import annotations

import logging

import pytest

from stratastore.adapters.vllm.plugin import (
    OWN_RESERVATION_ENV,
    RESERVED_CPU_ENV,
    OwnReservation,
    register,
)

WARNING = f"{RESERVED_CPU_ENV} is less than the minimum requirement: 2 cores"


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord(
        "vllm.utils.ompmultiprocessing", logging.WARNING, "f", 1, msg, (), None
    )


def test_the_warning_the_connectors_setting_causes_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(RESERVED_CPU_ENV, "1")
    monkeypatch.setenv(OWN_RESERVATION_ENV, "1")
    f = OwnReservation()
    assert not f.filter(_record(WARNING))
    assert f.filter(_record("another warning"))  # nothing else is touched


def test_a_value_the_user_set_is_still_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESERVED_CPU_ENV, "1")
    monkeypatch.delenv(OWN_RESERVATION_ENV, raising=False)
    assert OwnReservation().filter(_record(WARNING))
    monkeypatch.setenv(OWN_RESERVATION_ENV, "1")
    monkeypatch.setenv(RESERVED_CPU_ENV, "0")  # changed by the user after the connector's
    assert OwnReservation().filter(_record(WARNING))


def test_register_installs_the_filter_once() -> None:
    logger = logging.getLogger("vllm.utils.ompmultiprocessing")
    register()
    register()
    assert sum(isinstance(f, OwnReservation) for f in logger.filters) == 1
