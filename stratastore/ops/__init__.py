"""Operator tools over a store's files: fsck and repair (FSCK.md), reachability, level discovery,
and the installer behind ``strata init``. Nothing here is on an engine's path."""
