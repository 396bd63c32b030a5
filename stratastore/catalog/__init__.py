"""The shared catalog (DESIGN layer 5b): conversations, sessions and chain membership in LMDB,
seen alike by every process; the GC that removes whole chains; explicit sessions.
May import format/, io/, store/ and chain/; never tiers/ or the facade."""

from .tables import Catalog, CatalogBusy, NameTaken, Removal, cut_manifest, pinned_length

__all__ = ["Catalog", "CatalogBusy", "NameTaken", "Removal", "cut_manifest", "pinned_length"]
