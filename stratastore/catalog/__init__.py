"""The shared catalog (spec F-CAT): conversations, sessions and chain membership in LMDB, seen
alike by every process (the tables, their rows, answers and decisions: tables.py), what a
manifest means to it (chains.py), the GC that removes whole chains (gc.py), opening it
(recovery.py). May import format/, io/, levels/ and chain/; never tiers/ or the facade."""

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
