"""``ram_mib`` over the machine's physical memory is a ConfigError. The default ``ram_mib`` is 8192
(plus 4 MiB of chunk slack a slot: 8208 MiB asked), and it is what ``strata init --yes`` writes "on
any machine", so on a machine with 8 GiB of RAM (MemTotal about 7.7 GiB: the kernel keeps some)
``Store.open(fp)`` with no configuration -- the README's first example -- refuses to open at all.
The defaults are "what a user with no configuration expects" (config.py): they must open on an
ordinary 8 GiB machine (only an explicit ``ram_mib`` the machine cannot hold is the user's
error)."""

from __future__ import annotations

import pytest

from stratastore import Store
from stratastore.tiers import ram
from tests.conftest import tiny_fp

FP = tiny_fp()


def test_the_defaults_open_on_an_8_gib_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ram, "mem_total", lambda: 7_900_000 * 1024)  # an 8 GiB machine
    with Store.open(FP, probe=lambda: 6 << 30) as store:  # the defaults
        assert store.stats()["park_target"] == "ram"
