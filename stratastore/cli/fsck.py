"""``strata fsck [PATH...]``: check a store's level directories offline and read-only
(:mod:`stratastore.ops.fsck`), ``--repair`` what can be fixed without losing valid data
(:mod:`stratastore.ops.repair`), or ``--remote``: the remote level's namespaces of
``--config``'s store name, by its backend's check (the registry row's ``fsck`` hook,
:func:`stratastore.levels.registry.fsck_shared`; spec F-REM).

Exit status (FSCK.md): 0 when no finding is an error, 1 when one is (after ``--repair``: when
the check that follows it finds one; ``--remote``: a namespace not clean), 2 when the check
could not run. ``--repair`` changes the store, so it asks first: ``--yes``, or ``yes`` typed at
a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stratastore.cli.common import AddCommand, levels_doc, store_levels
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.format import LevelKeys
from stratastore.levels.findings import KEYED_UNCHECKED, PAGE_HASH_MISMATCH, SIDECAR_UNAUTHENTICATED
from stratastore.levels.registry import fsck_shared
from stratastore.levels.shared_check import NamespaceCheck

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    fk = command("fsck", help="check store directories offline (read-only)")
    fk.add_argument(
        "dirs",
        nargs="*",
        metavar="PATH",
        help="the store: its root directory (holding warm/ and cold/), a level "
        "directory or its config file (default: --config's levels)",
    )
    fk.add_argument("--deep", action="store_true", help="re-hash every page (default: sample)")
    fk.add_argument("--json", action="store_true")
    fk.add_argument(
        "--repair",
        action="store_true",
        help="fix what can be fixed without losing valid data (offline)",
    )
    fk.add_argument("--yes", action="store_true", help="confirm --repair without asking")
    fk.add_argument(
        "--key-file",
        metavar="FILE",
        help="the secrets of keyed levels (spec F-KEYED), one a line: every level checked is "
        "checked with them (default: each level's key_file or key_env of --config)",
    )
    fk.add_argument(
        "--remote",
        action="store_true",
        help="check the remote level of --config (remote_url, remote_name) instead: "
        "its namespaces only, never another key on the server",
    )
    fk.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Repair first when asked (each action printed), then check: every finding printed with
    its id and severity (FSCK.md), or one JSON document."""
    from stratastore.ops.fsck import fsck
    from stratastore.ops.repair import repair

    if args.remote:
        return _remote(args)
    levels = store_levels(args)
    dirs = list(levels.checked)
    keys = _level_keys(args, dirs)
    if not args.json:
        print(levels.describe())
    if args.repair:
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError(
                    "fsck --repair changes the store: add --yes to confirm "
                    "(and make sure no process has it open)"
                )
            if input("repair moves damaged files aside and rebuilds indexes; type yes: ") != "yes":
                raise ConfigError("repair not confirmed; nothing was changed")
        for action in repair(dirs, levels=levels, keys=keys):
            print(f"repair: {action.kind}: {action.object}: {action.detail}")
    findings = list(fsck(dirs, deep=args.deep, levels=levels, keys=keys))
    errors = sum(f.severity == "error" for f in findings)
    if args.json:
        doc = {
            "dirs": args.dirs,
            **levels_doc(levels),
            "deep": args.deep,
            "errors": errors,
            "findings": [f.as_dict() for f in findings],
        }
        print(json.dumps(doc, indent=2))
    else:
        for f in findings:
            print(f"{f.severity}: {f.id}: {f.object}: {f.detail}")
        print(f"{len(findings)} findings, {errors} errors in {len(dirs)} level(s)")
    return 1 if errors else 0


def _level_keys(args: argparse.Namespace, dirs: list[str]) -> dict[str, LevelKeys]:
    """The keys of the keyed levels among ``dirs``, by absolute path: ``--key-file``'s for
    every one, else each level's own of ``--config`` (``key_file`` or ``key_env``). A file or
    variable that cannot be used is a ConfigError naming it (exit 2), never a secret."""
    from stratastore.io import pathnames
    from stratastore.levels.level_keys import level_keys, read_key_file

    if args.key_file:
        given = LevelKeys(read_key_file(args.key_file))
        return {pathnames.abspath(d): given for d in dirs}
    cfg: StoreConfig | None = args.store_config
    out: dict[str, LevelKeys] = {}
    for spec in cfg.specs if cfg is not None else ():
        if spec.dir and not spec.shared and (keys := level_keys(spec.table())) is not None:
            out[pathnames.abspath(spec.dir)] = keys
    return out


def _remote(args: argparse.Namespace) -> int:
    """``strata fsck --remote``: the remote level's namespaces of ``--config``'s store name
    (spec F-REM-1); exit 1 when one is not clean (after ``--repair``: when it is not clean when
    checked again). The counts are what the check found, before any repair."""
    cfg: StoreConfig | None = args.store_config
    spec = cfg.remote if cfg is not None else None
    if cfg is None or spec is None or not spec.url:
        raise ConfigError(
            "fsck --remote checks the remote level of a config: pass --config "
            "FILE with remote_url (and remote_name) set"
        )
    if args.dirs:
        raise ConfigError("fsck --remote takes no PATH: it checks --config's remote level")
    if args.repair and not args.yes:
        raise ConfigError(
            "fsck --remote --repair deletes orphan parts and segments missing a "
            "part in the remote namespace: add --yes to confirm"
        )
    found = fsck_shared(spec.url, cfg.level_settings(spec), repair=args.repair, deep=args.deep)
    rows = [_namespace_row(ns) for ns in found.namespaces]
    bad = found.not_clean
    if args.json:
        doc = {
            "remote": found.level,
            "name": found.name,
            "namespaces": rows,
            "not_clean": bad,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(f"remote level {found.level}, store name {found.name!r}: {len(rows)} namespace(s)")
        for r, ns in zip(rows, found.namespaces, strict=True):
            counts = (*ns.counts, "repaired")
            what = r["problem"] or ", ".join(f"{k}={r[k]}" for k in counts)
            model = r["model"] or "no commit record names its model"
            print(f"{'ok' if r['clean'] else 'NOT CLEAN'}: {r['namespace']} ({model}): {what}")
            for f in r.get("findings", []):
                if "segment" not in f:  # KEYED_UNCHECKED: a count, never repaired
                    print(f"  {f['id']}: {f['detail']}")
                    continue
                removed = " (removed)" if r["repaired"] else ""
                where = f" page {f['page']}" if "page" in f else ""
                print(f"  {f['id']}: segment {f['segment']}{where}{removed}")
    return 1 if bad else 0


def _namespace_row(ns: NamespaceCheck) -> dict[str, Any]:
    """One namespace of the check as a row of the output: clean as checked, or as checked
    again after the repair (what the repair left); its counts in the order the backend names
    them, each damaged segment as a ``PAGE_HASH_MISMATCH`` finding, each record a keyed level
    does not accept as ``SIDECAR_UNAUTHENTICATED`` and keyed records fsck had no key for as
    one ``KEYED_UNCHECKED`` (spec F-KEYED-6)."""
    row: dict[str, Any] = {
        "namespace": ns.prefix,
        "model": ns.model,
        "problem": ns.problem,
        "clean": ns.clean,
    }
    if ns.counts:
        row |= {
            **ns.counts,
            "repaired": ns.repaired,
            "findings": [
                *(
                    {"id": PAGE_HASH_MISMATCH.id, "segment": k.hex(), "page": page}
                    for k, page in ns.damaged
                ),
                *(
                    {"id": SIDECAR_UNAUTHENTICATED.id, "segment": k.hex()}
                    for k in ns.unauthenticated
                ),
                *(
                    [
                        {
                            "id": KEYED_UNCHECKED.id,
                            "segments": n,
                            "detail": f"{n} keyed segment(s) not checked: fsck was given no "
                            "key for them (set the level's key_file or key_env in the config)",
                        }
                    ]
                    if (n := ns.counts.get("keyed_unchecked", 0))
                    else []
                ),
            ],
        }
    return row
