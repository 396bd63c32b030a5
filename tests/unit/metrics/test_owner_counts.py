"""Each owner's counts are made from the counter table: a name that is not a counter row of its
keeper fails when the owner is made, an increment of a row the owner did not name fails at once,
and a keeper's figures are its owners' counts summed in the table's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Store
from stratastore.metrics.counters import counter_keys
from stratastore.metrics.counts import Counts, total
from tests.conftest import conversation_kv, tiny_fp


def test_a_name_not_in_the_table_fails_when_the_counts_are_made() -> None:
    with pytest.raises(ValueError, match="parks_rma"):
        Counts("flow", ("parks_ram", "parks_rma"))
    with pytest.raises(ValueError, match="tokens_reread"):  # a row, but the Store's, not the flow's
        Counts("flow", ("tokens_reread",))


def test_an_increment_of_a_row_the_owner_did_not_name_fails() -> None:
    counts = Counts("flow", ("parks_ram",))
    counts["parks_ram"] += 2
    with pytest.raises(KeyError, match="discards"):
        counts["discards"] += 1
    assert dict(counts) == {"parks_ram": 2}


def test_a_keepers_figures_are_its_owners_counts_summed_in_the_table_order() -> None:
    a, b = Counts("flow", ("tokens_restored", "hits_ram")), Counts("flow", ("tokens_restored",))
    a["tokens_restored"] += 3
    a["hits_ram"] += 1
    b["tokens_restored"] += 4
    figures = total("flow", [a, b])
    assert tuple(figures) == counter_keys("flow")
    assert figures["tokens_restored"] == 7 and figures["hits_ram"] == 1
    assert figures["discards"] == 0


def test_the_stores_flow_figures_add_up_its_parts(tmp_path: Path) -> None:
    """What the park flow, the restore flow and the sources count each on their own comes out
    as one set of figures in ``stats()``."""
    cfg = {"ram_mib": 4, "cold_dir": str(tmp_path / "c"), "cold_mib": 64}
    fp = tiny_fp()
    with Store.open(fp, cfg, probe=lambda: 1 << 40) as store:
        conv, kv = conversation_kv("a", 64, 0)
        assert store.park(conv, kv.copy()).where == "ram"
        buf = np.zeros(64 * fp.token_bytes, np.uint8)
        assert store.restore(conv.tokens, buf).tokens == 64  # from RAM (its source counts)
        assert store.restore(np.arange(900, 910), buf[: 10 * fp.token_bytes]).tokens == 0
        s = store.stats()
    assert (s["parks_ram"], s["hits_ram"], s["tokens_restored"], s["restore_misses"]) == (
        1,
        1,
        64,
        1,
    )
