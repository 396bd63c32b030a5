"""Opening the levels of a configuration: the disk levels in order (``levels = [...]``, or the
``warm_*``/``cold_*`` settings it aliases), each opened from its spec by
:func:`~stratastore.levels.registry.open_level` (the backend chosen by the spec's scheme, never
named here) with its budget, age limit and the next level it degrades into (spec F-SC-5: the
level byte each writes is :func:`~stratastore.config.level_byte`'s); the shared catalog in the
last of them, which must be a level that can host it (``hosts_catalog``); and the shared remote
level (spec F-REM) when ``remote_url`` is set."""

from __future__ import annotations

from collections.abc import Callable

from stratastore.catalog import Catalog
from stratastore.catalog.gc import Collector
from stratastore.catalog.recovery import finish_ticket, recover
from stratastore.config import LevelSpec, StoreConfig, level_byte
from stratastore.errors import ConfigError
from stratastore.format import Level, ModelFingerprint
from stratastore.io import files
from stratastore.io.system import volume_bytes
from stratastore.levels.backend import CatalogHost, SharedBackend
from stratastore.levels.cascade import DiskLevel, open_cascade
from stratastore.levels.directory import shared_directory
from stratastore.levels.registry import open_level, scheme_of
from stratastore.tiers.admission import MIB
from stratastore.tiers.remote import RemoteLevel
from stratastore.tiers.writer import DiskWriter

__all__ = ["attach_catalog", "check_levels", "open_levels", "open_remote"]


def check_levels(cfg: StoreConfig, warn: Callable[[str], None]) -> None:
    """Start-up checks of the levels' settings. A level is on only with a directory *and* a
    budget ("empty / 0 = off"); one without the other is said loudly here, never
    silently absent. Two levels on one directory are refused: the first move down would lock
    itself. A level directory whose parent does not exist is refused unless ``create_dirs``."""
    given = [(lv.name, lv.dir or _shown(lv.url), lv.mib) for lv in cfg.levels] or [
        ("warm", cfg.warm_dir, cfg.warm_mib),
        ("cold", cfg.cold_dir, cfg.cold_mib),
    ]
    for name, d, mib in given:
        if bool(d) != (mib > 0):
            key = f"{name}_" if not cfg.levels else f"levels[{name}]."
            warn(
                f"the {name} level is OFF: {key}dir={d!r} with {key}mib={mib}; a level needs "
                f"both (set its budget in MiB, or clear its directory)"
            )
    on_dirs = [s for s in cfg.disk_levels() if s.dir]  # a URL level has no directory
    same = shared_directory([s.dir for s in on_dirs])
    if same is not None:
        first, spec, real = on_dirs[same[0]], on_dirs[same[1]], same[2]
        raise ConfigError(
            f"{first.name}_dir={first.dir!r} and {spec.name}_dir={spec.dir!r} are the same "
            f"directory ({real}); give the {spec.name} level a directory of its own (or turn it "
            "off)"
        )
    if not cfg.create_dirs:
        for spec in cfg.disk_levels():
            if spec.dir and not spec.default_dir:  # the user's cache directory is made whole
                _require_parent(cfg, spec)


def _shown(url: str) -> str:
    """A level's URL as a message shows it: its scheme alone (a URL may carry a credential)."""
    return f"{scheme_of(url)}://..." if url else ""


def _require_parent(cfg: StoreConfig, spec: LevelSpec) -> None:
    """A level directory is made only under a parent that exists (unless ``create_dirs``): a
    ``/nvme/strata`` with no disk mounted at ``/nvme`` must not land on the root filesystem."""
    parent = files.missing_parent(spec.dir)
    if parent is None:
        return
    setting = cfg.setting_name(spec, "dir")
    raise ConfigError(
        f"{setting}={spec.dir!r}: its parent directory {parent} does not exist "
        f"(a disk not mounted, or a typo); mount or create {parent}, correct "
        f"the setting, or set create_dirs = true to make the missing "
        f"directories"
    )


def _warn_over_volume(cfg: StoreConfig, spec: LevelSpec, warn: Callable[[str], None]) -> None:
    """Say so when a level's budget is more than the whole volume its directory is on: the
    disk fills (and writes fail) before the level ever frees space for its budget."""
    size = volume_bytes(spec.dir)
    if size is None or spec.mib * MIB <= size:
        return
    setting = cfg.setting_name(spec, "mib")
    warn(
        f"the {spec.name} level's budget {setting}={spec.mib} ({spec.mib:,} MiB) is more than "
        f"the volume {spec.dir} is on holds ({size // MIB:,} MiB): the disk fills before the "
        f"level frees space; set {setting} to at most {size // MIB} (less what else uses the "
        f"volume)"
    )


def open_levels(
    cfg: StoreConfig, fp: ModelFingerprint, warn: Callable[[str], None]
) -> list[DiskLevel]:
    """The disk levels, first to last, each linked to the next; all closed again on failure."""
    check_levels(cfg, warn)
    specs = cfg.disk_levels()

    def open_one(i: int, next_level: DiskLevel | None) -> DiskLevel:
        spec = specs[i]
        level = level_byte(i, len(specs), spec.name)
        store = open_level(spec.dir or spec.url, fp, level, cfg.level_settings(spec))
        try:
            if spec.dir:
                _warn_over_volume(cfg, spec, warn)
            return DiskLevel(
                spec.name,
                store,
                spec.mib * MIB,
                max_age_s=spec.max_age_s,
                when_full=cfg.when_full,
                next_level=next_level,
            )
        except BaseException:
            store.close()
            raise

    return open_cascade(len(specs), open_one)


def attach_catalog(
    levels: list[DiskLevel],
    root: bytes,
    token_bytes: int,
    manifest_dir: str,
    file_mode: int,
    warn: Callable[[str], None],
) -> tuple[Catalog, Collector, DiskWriter, list[tuple[str, str]]]:
    """Open the shared catalog in the last level's environment (spec F-CAT-1), bring it in line
    with the files (recovery), and wire the levels to its GC: the last level frees space by
    shortening the oldest conversations, every level cuts the chains that name an unreadable
    segment before it discards it. Returns the catalog, its GC, the disk writer and the
    manifests that were refused at open (name, why)."""
    last = levels[-1].store
    if not (last.hosts_catalog and isinstance(last, CatalogHost)):
        raise ConfigError(
            f"the last disk level {levels[-1].name} ({_shown(last.path)}) cannot hold the shared "
            "catalog; make the last level a directory"
        )
    catalog = Catalog(last.catalog_tables())
    gc = Collector(catalog, lambda: [lvl.store for lvl in levels], manifest_dir, file_mode)
    last_level = levels[-1].store
    levels[-1].free = lambda before: gc.free_oldest(
        before_ns=before, level=last_level if before is None else None
    )
    for lvl in levels:
        lvl.discard = gc.discard
    writer = DiskWriter(levels, catalog, gc, root, token_bytes, manifest_dir, file_mode, warn)
    catalog.on_dead = lambda t: finish_ticket(catalog, gc, root, manifest_dir, t)
    got = recover(catalog, gc, root, manifest_dir, warn)
    return catalog, gc, writer, got.skipped


def open_remote(
    cfg: StoreConfig, fp: ModelFingerprint, levels: list[DiskLevel], warn: Callable[[str], None]
) -> RemoteLevel | None:
    """The shared remote level (``cfg.remote``: ``remote_url``, or a ``[[levels]]`` entry with a
    Redis URL), opened through the registry with its own settings table: it needs a local
    disk level (the catalog lives there, and a park is acknowledged by the local write)."""
    spec = cfg.remote
    if spec is None:
        return None
    if not levels:
        raise ConfigError(
            f"setting {cfg.setting_name(spec, 'url')} needs a local disk level "
            "(cold_dir and cold_mib, or levels): a park is written there first, "
            "then copied to the remote level"
        )
    backend = open_level(spec.url, fp, Level.COLD, cfg.level_settings(spec))
    if not (backend.shared and isinstance(backend, SharedBackend)):
        backend.close()
        raise ConfigError(
            f"setting {cfg.setting_name(spec, 'url')}: that level is not one several nodes "
            "can share; use a redis:// or redis+cluster:// URL"
        )
    return RemoteLevel(backend, fp, warn)
