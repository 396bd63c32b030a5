"""SGLang HiCache's storage backend on stratastore's chunk store (docs/engine.md, "SGLang
HiCache: a storage backend"): ``--hicache-storage-backend dynamic`` with
``{"backend_name": "strata", "module_path": "stratastore.adapters.sglang", "class_name":
"StrataHiCacheStorage", "levels": [...]}``."""

from stratastore.adapters.sglang.backend import StrataHiCacheStorage, page_namespace
from stratastore.adapters.sglang.settings import BackendSettings

__all__ = ["BackendSettings", "StrataHiCacheStorage", "page_namespace"]
