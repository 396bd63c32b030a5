"""The shared catalog (DESIGN layer 5b): conversations, sessions and chain membership in LMDB,
seen alike by every process (its decisions tables.py, its answers reads.py, the tables' rows
rows.py), what a manifest means to it (chains.py), the GC that removes whole chains (gc.py),
opening it (recovery.py). May import format/, io/, store/, levels/
and chain/; never tiers/ or the facade."""

from stratastore.catalog.chains import conv_id_key, cut_manifest, manifest_keys, pinned_length
from stratastore.catalog.tables import Catalog, CatalogBusy, NameTaken, Removal

__all__ = [
    "Catalog",
    "CatalogBusy",
    "NameTaken",
    "Removal",
    "conv_id_key",
    "cut_manifest",
    "manifest_keys",
    "pinned_length",
]
