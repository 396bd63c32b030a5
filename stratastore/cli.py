"""The ``strata`` command line. User errors print one line and exit non-zero, never a traceback.

Commands: ``demo`` (the main job: a small end-to-end run of what exists), ``inspect PATH``
(list a store's segments, level by level; PATH as fsck takes it). Later issues add fsck,
monitor, init, bench and sim.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from stratastore import __version__
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.format import ModelFingerprint, decode_sidecar
from stratastore.format.sidecar import MAX_SIDECAR_BYTES
from stratastore.io import files
from stratastore.levels.local import SegmentStore
from stratastore.ops.installer import MODEL_SIZES
from stratastore.ops.level_dirs import StoreLevels, find_store_levels

__all__ = ["main"]


def _fingerprint_from_dir(path: str) -> ModelFingerprint | None:
    """The fingerprint of the first committed sidecar in level ``path`` (inspect needs no
    model), or None when it holds no segment (a level that holds only chains, or nothing yet)."""
    first: StrataError | None = None
    for name in sorted(files.listdir(path)):
        if name.startswith("strata-conv-") and name.endswith(".side"):
            try:
                raw = files.read_file(os.path.join(path, name), MAX_SIDECAR_BYTES)
                return decode_sidecar(raw, name).fingerprint
            except StrataError as e:  # a link, a FIFO, a damaged one: the store skips it
                first = first or e
    if first is not None:  # not one sidecar could be read: why the first could not
        raise first
    return None


def _special_segment_file(d: str, key: bytes) -> dict[str, str] | None:
    """Why a segment's sidecar or data file is not one a store reads (a symbolic link, a FIFO:
    ``lstat``, spec F-DIR-8), as an entry of inspect's skipped list; None when both are."""
    from stratastore.format import data_name, sidecar_name
    from stratastore.io import guard

    for name in (sidecar_name(key), data_name(key)):
        try:
            guard.require_regular(os.path.join(d, name), missing_ok=True)
        except StrataError as e:
            return {"file": name, "reason": str(e)}
    return None


def _inspect_level(path: str) -> dict[str, Any]:
    """One level's segments (as a store opening it reads them) and what it did not adopt."""
    fp = _fingerprint_from_dir(path)
    if fp is None:
        return {"dir": path, "model": None, "entries": 0, "disk_bytes": 0, "segments": [],
                "skipped": []}  # fmt: skip
    with SegmentStore.open(path, fp, create=False) as store:
        rows: list[dict[str, Any]] = []
        skipped = [{"file": s.name, "reason": s.reason} for s in store.skipped]
        for key in store.keys():
            special = _special_segment_file(path, key)
            if special is not None:  # indexed, but a link or a FIFO now (spec F-DIR-8)
                skipped.append(special)
                continue
            rec = store.record(key)
            rows.append(
                {
                    "key": key.hex(),
                    "kind": rec.kind.name.lower(),
                    "codec": rec.codec.name.lower(),
                    "tokens": [rec.token_start, rec.token_end],
                    "pages": rec.page_count,
                    "bytes": rec.total_bytes,
                    "sealed_at_ns": rec.sealed_at_ns,
                }
            )
        disk_bytes = store.stats().disk_bytes
    return {"dir": path, "model": fp.describe(), "entries": len(rows), "disk_bytes": disk_bytes,
            "segments": rows, "skipped": skipped}  # fmt: skip


def cmd_inspect(args: argparse.Namespace) -> int:
    """The segments of each level of the store named as fsck takes it (a store root, a level
    directory or a config file; default: ``--config``'s levels)."""
    levels = _store_levels(args)
    found = [_inspect_level(d) for d in levels.checked]
    if args.json:
        models = {lv["model"] for lv in found if lv["model"] is not None}
        doc = {
            "dirs": args.dirs,
            **_levels_doc(levels),
            "model": models.pop() if len(models) == 1 else None,  # None: none, or several
            "entries": sum(lv["entries"] for lv in found),  # the segments a store reads
            "disk_bytes": sum(lv["disk_bytes"] for lv in found),
            "segments": [{"level": lv["dir"], **r} for lv in found for r in lv["segments"]],
            "skipped": [{"level": lv["dir"], **s} for lv in found for s in lv["skipped"]],
            "by_level": [{k: v for k, v in lv.items() if k not in ("segments", "skipped")}
                         for lv in found],
        }  # fmt: skip
        print(json.dumps(doc, indent=2))
        return 0
    if not (len(args.dirs) == 1 and levels.checked == (os.path.abspath(args.dirs[0]),)):
        print(levels.describe())  # how the levels were found, unless one level was named
    for lv in found:
        print(f"{lv['dir']}: {lv['entries']} segments, {lv['disk_bytes']:,} bytes"
              + (f", {lv['model']}" if lv["model"] else ""))  # fmt: skip
        for r in lv["segments"]:
            t0, t1 = r["tokens"]
            print(
                f"  {r['key'][:16]}  {r['kind']:<5} {r['codec']:<4} tokens [{t0}, {t1}) "
                f"{r['pages']} pages {r['bytes']:,} B"
            )
        for s in lv["skipped"]:
            print(f"  not adopted: {s['file']}: {s['reason']}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from stratastore.harness.demo import run_demo

    if args.dir is not None:
        return run_demo(os.path.abspath(args.dir), args.requests, args.store_config)
    with tempfile.TemporaryDirectory(prefix="strata-demo-") as d:
        return run_demo(d, args.requests, args.store_config, kept=False)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} needs one or more integers >= 0")
    return values


def _print_rows(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    for line in [headers, *rows]:
        print("  ".join(f"{x!s:>{w}}" for x, w in zip(line, widths, strict=True)))


def cmd_sim_agent_edit(args: argparse.Namespace) -> int:
    from stratastore.harness.sim import AgentEdit, run_agent_edit

    results = [
        run_agent_edit(
            AgentEdit(
                args.system_tokens,
                args.turns,
                args.turn_tokens,
                args.checkpoints,
                edit_back,
                args.policy,
                args.layout,
                args.page_tokens,
            )
        )
        for edit_back in args.edit_back
    ]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        return 0
    first = results[0]
    print(
        f"agent-edit: {first['held_tokens']:,} tokens held, policy {args.policy}, "
        f"layout {args.layout}, kept (tokens before the end): "
        f"{', '.join(f'{k:,}' for k in first['kept'])}"
    )
    _print_rows(
        ["edit back", "resumed at", "via", "re-read"],
        [
            [
                f"{r['held_tokens'] - r['edit_at']:,}",
                f"{r['resumed_at']:,}",
                r["resumed_via"] or "-",
                f"{r['reread_tokens']:,}",
            ]
            for r in results
        ],
    )
    return 0


def cmd_sim_edit_sweep(args: argparse.Namespace) -> int:
    from stratastore.harness.sim import AgentEdit, run_agent_edit

    rows, doc = [], []
    for d in args.edit_back:
        base = dict(
            system_tokens=args.system_tokens,
            turns=args.turns,
            turn_tokens=args.turn_tokens,
            checkpoints=args.checkpoints,
            edit_back=d,
        )
        lru = run_agent_edit(AgentEdit(**base, policy="lru"))
        spread = run_agent_edit(AgentEdit(**base, policy="spread"))
        page = run_agent_edit(
            AgentEdit(**base, policy="spread", layout="attention", page_tokens=args.page_tokens)
        )
        doc.append(
            {
                "edit_back": d,
                "lru": lru["reread_tokens"],
                "spread": spread["reread_tokens"],
                "page": page["reread_tokens"],
            }
        )
        rows.append(
            [
                f"{d:,}",
                f"{lru['reread_tokens']:,}",
                f"{spread['reread_tokens']:,}",
                f"{page['reread_tokens']:,}",
            ]
        )
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_rows(
            ["edit back", "lru re-reads", "spread re-reads", "page-granular re-reads"], rows
        )
    return 0


def cmd_sim_park_truncate(args: argparse.Namespace) -> int:
    from stratastore.harness.sim import ParkTruncate, run_park_truncate

    modes = {"on": [True], "off": [False], "both": [True, False]}[args.truncate]
    results = [
        run_park_truncate(
            ParkTruncate(
                args.budget_mib,
                args.slots,
                args.min_tokens,
                args.every,
                args.first,
                tuple(args.others),
                args.token_kib,
                args.state_mib,
                truncate,
            )
        )
        for truncate in modes
    ]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        return 0
    for r in results:
        print(
            f"park-truncate, truncate {'on' if r['truncate'] else 'off'}, budget "
            f"{r['budget_mib']:,} MiB:"
        )
        _print_rows(
            ["request", "parks", "kept tokens", "shrunk", "evicted", "entries", "MiB"],
            [
                [
                    s["request"],
                    s["parked"],
                    f"{s['kept_tokens'] or 0:,}",
                    ",".join(f"{k}->{n:,}" for k, n in s["shrunk"]) or "-",
                    ",".join(s["evicted"]) or "-",
                    s["cache_entries"],
                    s["cache_mib"],
                ]
                for s in r["steps"]
            ],
        )
        print(
            f"  return of A ({r['return_prompt_tokens']:,} tokens): restored "
            f"{r['restored_tokens']:,}, re-read {r['reread_tokens']:,}"
        )
    return 0


def cmd_sim_low_ram(args: argparse.Namespace) -> int:
    from stratastore.harness.sim import LowRam, run_low_ram

    cfg = LowRam(args.slots, args.conversations, args.requests, args.scale, args.seed)
    if args.dir is not None:
        doc = run_low_ram(cfg, os.path.abspath(args.dir))
    else:
        with tempfile.TemporaryDirectory(prefix="strata-sim-") as d:
            doc = run_low_ram(cfg, d)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    old, new = doc["old"], doc["new"]
    print(
        f"low-ram (seed 000), {args.slots} slots, {args.requests} requests, bytes scaled "
        f"1/{args.scale}, tokens at full scale:"
    )
    rows = [[k.replace("_", " "), f"{old[k]:,}", f"{new[k]:,}"] for k in old if k != "rule"]
    _print_rows(["", old["rule"], new["rule"]], rows)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Seeds 004 and 001 run through the Store turn by turn, beside the simulator and the seeds'
    tables (:mod:`stratastore.harness.replay`); exit 1 when a Store figure differs from a seed's."""
    from stratastore.harness.replay import format_replay, run_replay

    rep = run_replay(os.path.abspath(args.dir) if args.dir is not None else None)
    print(json.dumps(rep.to_json(), indent=2) if args.json else format_replay(rep))
    return 0 if rep.ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from stratastore.harness.bench import run_bench

    if args.peers:
        return _bench_peers(args)
    if args.lmcache:
        return _bench_lmcache(args)
    doc = run_bench(args.dir, mib=args.mib, rounds=args.rounds, cold=not args.hot_only)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"strata bench: {doc['bytes'] / 2**30:.2f} GiB in {doc['segments']} segments, "
        f"medians of {doc['rounds']} rounds, cold cache by {doc['cold_cache']}"
    )
    _print_rows(["", "GB/s"], [[k, f"{v:.2f}"] for k, v in doc["gb_per_s"].items()])
    _print_rows(["ratio", ""], [[k, f"{v:.2f}x"] for k, v in doc["ratios"].items()])
    _print_rows(
        ["restore split", "GB/s"],
        [[k, f"{v:.2f}"] for k, v in doc["restore_passes_gb_per_s"].items()],
    )
    return 0


def _bench_peers(args: argparse.Namespace) -> int:
    from stratastore.harness.peers import render_peers, run_peers

    doc = run_peers(args.dir, mib=args.mib, rounds=args.rounds, cold=not args.hot_only)
    print(json.dumps(doc, indent=2) if args.json else render_peers(doc))
    return 0


def _bench_lmcache(args: argparse.Namespace) -> int:
    from stratastore.harness.lmcache_bench import render_lmcache, run_lmcache

    doc = run_lmcache(args.dir, mib=args.mib, rounds=args.rounds, cold=not args.hot_only)
    print(json.dumps(doc, indent=2) if args.json else render_lmcache(doc))
    return 0


def cmd_fsck(args: argparse.Namespace) -> int:
    from stratastore.ops.fsck import fsck
    from stratastore.ops.repair import repair

    if args.remote:
        return _fsck_remote(args)
    levels = _store_levels(args)
    dirs = list(levels.checked)
    if not args.json:
        print(levels.describe())
    if args.repair:
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError("fsck --repair changes the store: add --yes to confirm "
                                  "(and make sure no process has it open)")  # fmt: skip
            if input("repair moves damaged files aside and rebuilds indexes; type yes: ") != "yes":
                raise ConfigError("repair not confirmed; nothing was changed")
        for action in repair(dirs, levels=levels):
            print(f"repair: {action.kind}: {action.object}: {action.detail}")
    findings = list(fsck(dirs, deep=args.deep, levels=levels))
    errors = sum(f.severity == "error" for f in findings)
    if args.json:
        print(json.dumps({"dirs": args.dirs, **_levels_doc(levels), "deep": args.deep,
                          "errors": errors, "findings": [f.as_dict() for f in findings]},
                         indent=2))  # fmt: skip
    else:
        for f in findings:
            print(f"{f.severity}: {f.id}: {f.object}: {f.detail}")
        print(f"{len(findings)} findings, {errors} errors in {len(dirs)} level(s)")
    return 1 if errors else 0


def _fsck_remote(args: argparse.Namespace) -> int:
    """``strata fsck --remote``: the remote level's namespaces of ``--config``'s store name
    (issue 17); exit 1 when one is not clean (after ``--repair``: when it is not clean when
    checked again). The counts are what the check found, before any repair."""
    from stratastore.levels.redis.fsck import PAGE_HASH_MISMATCH, fsck_remote
    from stratastore.levels.redis.settings import RemoteSettings

    cfg: StoreConfig | None = args.store_config
    if cfg is None or not cfg.remote_url:
        raise ConfigError("fsck --remote checks the remote level of a config: pass --config "
                          "FILE with remote_url (and remote_name) set")  # fmt: skip
    if args.dirs:
        raise ConfigError("fsck --remote takes no PATH: it checks --config's remote level")
    if args.repair and not args.yes:
        raise ConfigError("fsck --remote --repair deletes orphan parts and segments missing a "
                          "part in the remote namespace: add --yes to confirm")  # fmt: skip
    settings = RemoteSettings.from_config(cfg)
    found = fsck_remote(settings, repair=args.repair, deep=args.deep)
    bad = 0
    rows: list[dict[str, Any]] = []
    for ns in found:
        rep = ns.report
        # clean as checked, or as checked again after the repair (what the repair left)
        clean = rep is not None and (ns.after.clean if ns.after is not None else rep.clean)
        bad += not clean
        rows.append({"namespace": ns.prefix, "model": ns.model, "problem": ns.problem,
                     "clean": clean, **({} if rep is None else {
                         "segments": rep.segments, "orphan_parts": len(rep.orphan_parts),
                         "missing_parts": len(rep.missing_parts),
                         "bad_records": len(rep.bad_records),
                         "stale_index": len(rep.stale_index), "unindexed": len(rep.unindexed),
                         "damaged": len(rep.damaged),
                         "used_recorded": rep.used_recorded, "used_actual": rep.used_actual,
                         "repaired": rep.repaired,
                         "findings": [{"id": PAGE_HASH_MISMATCH.id, "segment": k.hex(),
                                       "page": page} for k, page in rep.damaged]})})  # fmt: skip
    if args.json:
        print(json.dumps({"remote": settings.shown, "name": settings.name, "namespaces": rows,
                          "not_clean": bad}, indent=2))  # fmt: skip
    else:
        print(f"remote level {settings.shown}, store name {settings.name!r}: "
              f"{len(rows)} namespace(s)")  # fmt: skip
        for r in rows:
            what = r["problem"] or ", ".join(f"{k}={r[k]}" for k in (
                "segments", "orphan_parts", "missing_parts", "bad_records", "stale_index",
                "unindexed", "damaged", "used_recorded", "used_actual", "repaired"))  # fmt: skip
            model = r["model"] or "no commit record names its model"
            print(f"{'ok' if r['clean'] else 'NOT CLEAN'}: {r['namespace']} ({model}): {what}")
            for f in r.get("findings", []):
                print(f"  {f['id']}: segment {f['segment']} page {f['page']}"
                      + (" (removed)" if r["repaired"] else ""))  # fmt: skip
    return 1 if bad else 0


def cmd_conformance(args: argparse.Namespace) -> int:
    """Check the levels against the spec's MUST clauses; the verdict cites the spec and the
    finding ids by their paths in the installed package (the conformance kit it ships)."""
    from stratastore.testing.conformance import check_conformance
    from stratastore.testing.vectors import kit_path

    levels = _store_levels(args)
    report = check_conformance(levels.checked, levels=levels)
    spec, ids = kit_path("SPEC.md"), kit_path("FSCK.md")
    if args.json:
        print(json.dumps({
            **_levels_doc(levels),
            "spec": spec,
            "finding_ids": ids,
            "conforms": report.conforms,
            "violations": {c: [f.as_dict() for f in fs] for c, fs in report.violations.items()},
            "allowed": [f.as_dict() for f in report.allowed],
        }, indent=2))  # fmt: skip
    else:
        print(levels.describe())
        for clause, found in sorted(report.violations.items()):
            for f in found:
                print(f"VIOLATES {clause}: {f.id}: {f.object}: {f.detail}")
        for f in report.allowed:
            print(f"allowed: {f.id}: {f.object}: {f.detail}")
        print(f"conforms to {spec}" if report.conforms else
              f"{len(report.violations)} MUST clauses violated (clauses: {spec}; "
              f"finding ids: {ids})")  # fmt: skip
    return 0 if report.conforms else 1


def _monitor_table(doc: dict[str, Any]) -> str:
    def mib(v: object) -> str:
        return f"{v / 2**20:,.0f}" if isinstance(v, (int, float)) else "-"

    def val(v: object) -> str:
        return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)

    snap = doc["snapshot"]
    lines = [f"strata monitor: {doc['path']}  " + (
        "no Store has published counters here yet" if snap is None else
        f"counters from pid {snap['pid']} ({'running' if snap['writer_alive'] else 'exited'}), "
        f"{snap['age_s']:.0f} s ago")]  # fmt: skip
    if doc.get("snapshot_problem"):
        lines.append(f"  warning: {doc['snapshot_problem']}")
    lines.append(f"  {'level':<6}{'entries':>9}{'MiB':>9}{'budget MiB':>12}{'oldest s':>10}"
                 f"{'hits':>7}{'moved down':>12}{'evicted':>9}  folder")  # fmt: skip
    for name, lv in doc["levels"].items():
        lines.append(f"  {name:<6}{val(lv['entries']):>9}{mib(lv['bytes']):>9}"
                     f"{mib(lv['budget']):>12}{val(lv.get('oldest_age_s')):>10}"
                     f"{val(lv.get('hits')):>7}{val(lv.get('degradations')):>12}"
                     f"{val(lv.get('evictions')):>9}  {lv['dir'] or '(in process)'}")  # fmt: skip
    c = doc["counters"]
    if c:
        lines.append(f"  parks ram={val(c['parks_ram'])} disk={val(c['parks_disk'])}  "
                     f"discards={val(c['discards'])}  evictions spilled={val(c['evict_spills'])}  "
                     f"hits ram={val(c['hits_ram'])} disk={val(c['hits_disk'])}  "
                     f"ladder restores={val(c['ladder_restores'])}")  # fmt: skip
        lines.append(f"  park target {c['park_target']} ({c['park_target_source']}); "
                     f"admission: {c['admission']}")  # fmt: skip
    return "\n".join(lines)


def cmd_monitor(args: argparse.Namespace) -> int:
    """The table refreshes in place until Ctrl-C (unless ``--once``); ``--json`` and
    ``--prometheus`` are for machines: one document, printed once, no screen codes."""
    from stratastore.metrics.monitor import prometheus_text, read_monitor

    if not (math.isfinite(args.interval) and args.interval > 0):  # sleep(-1) raises, 0 spins
        raise ConfigError(f"--interval {args.interval:g} must be a positive number of "
                          "seconds (e.g. --interval 1, the default)")  # fmt: skip
    once = args.once or args.json or args.prometheus
    while True:
        doc = read_monitor(args.dir) if args.dir else read_monitor(levels=_config_dirs(args))
        if args.json:
            out = json.dumps(doc, indent=2)
        elif args.prometheus:
            levels = {n: {k: v for k, v in lv.items() if k != "dir"}
                      for n, lv in doc["levels"].items()}  # fmt: skip
            # every series the Store publishes (text ones too: admission, park target); what
            # the snapshot does not hold stays absent, never 0
            counters = {k: v for k, v in doc["counters"].items() if v is not None}
            out = prometheus_text({**counters, "levels": levels})
        else:
            out = _monitor_table(doc)
        if once:
            print(out)
            return 0
        sys.stdout.write("\x1b[H\x1b[2J" + out + "\n(refreshing every "
                         f"{args.interval:g} s; Ctrl-C to stop)\n")  # fmt: skip
        sys.stdout.flush()
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def _store_levels(args: argparse.Namespace) -> StoreLevels:
    """The levels fsck and conformance check: those of the paths given (a store root, a level
    directory or a config file each), else those of ``--config``."""
    return find_store_levels(args.dirs, args.store_config, args.config or "--config")


def _levels_doc(levels: StoreLevels) -> dict[str, Any]:
    """Which levels a command checked, for its ``--json`` output."""
    return {"levels": list(levels.checked), "store_levels": list(levels.store),
            "levels_complete": levels.complete, "levels_from": levels.found_from}  # fmt: skip


def _config_dirs(args: argparse.Namespace) -> list[str]:
    """The level directories of ``--config`` (first level first), for commands given no DIR."""
    cfg: StoreConfig | None = args.store_config
    dirs = [] if cfg is None else [lv.dir for lv in cfg.disk_levels()]
    if not dirs:
        raise ConfigError("name the store's level directories, or pass --config FILE whose "
                          "levels (or warm_dir/cold_dir, with budgets) name them")  # fmt: skip
    return dirs


def cmd_init(args: argparse.Namespace) -> int:
    from stratastore.ops.installer import measure_machine, run_init, write_config

    def ask(question: str) -> str:
        try:
            return input(question)
        except EOFError:  # no answer: the default
            print()
            return ""

    cfg = run_init(yes=args.yes, ask=ask, say=print, machine=measure_machine(),
                   model_size=args.model_size)  # fmt: skip
    write_config(cfg, os.path.abspath(args.output), force=args.force)
    changed = {k: v for k, v in cfg.to_mapping().items() if getattr(StoreConfig(), k) != v}
    print(f"wrote {args.output}: " + (", ".join(f"{k}={v!r}" for k, v in changed.items())
                                      if changed else "the defaults"))  # fmt: skip
    return 0


def _add_sim(command: Any, common: list[argparse.ArgumentParser]) -> None:
    sim = command("sim", help="replay a workload against the real policy code")
    scen = sim.add_subparsers(dest="scenario", metavar="SCENARIO", required=True)
    scenario = functools.partial(scen.add_parser, parents=common)

    def agent_args(p: argparse.ArgumentParser, edit_default: str) -> None:
        p.add_argument("--system-tokens", type=_positive, default=9525)
        p.add_argument("--turns", type=_positive, default=200)
        p.add_argument("--turn-tokens", type=_positive, default=1000)
        p.add_argument(
            "--checkpoints",
            type=_positive,
            default=6,
            help="checkpoints kept per conversation, root included",
        )
        p.add_argument(
            "--edit-back",
            type=_int_list,
            default=_int_list(edit_default),
            help="tokens before the end where the client rewrites history "
            "(a comma-separated list for several)",
        )
        p.add_argument("--page-tokens", type=_positive, default=16)
        p.add_argument("--json", action="store_true")

    ae = scenario("agent-edit", help="retention against an edit back in history")
    agent_args(ae, "6000")
    ae.add_argument("--policy", choices=["spread", "lru"], default="spread")
    ae.add_argument(
        "--layout",
        choices=["hybrid", "attention"],
        default="hybrid",
        help="attention: resume on any whole page, not only on checkpoints",
    )
    ae.set_defaults(func=cmd_sim_agent_edit)
    sw = scenario("edit-sweep", help="re-read tokens of lru, spread and page resume")
    agent_args(sw, "1000,2000,4000,6000,8000,16000,32000,42000,64000,100000,150000")
    sw.set_defaults(func=cmd_sim_edit_sweep)
    pt = scenario("park-truncate", help="park the prefix that fits")
    pt.add_argument("--budget-mib", type=_positive, default=3500)
    pt.add_argument("--slots", type=_positive, default=2)
    pt.add_argument("--min-tokens", type=int, default=4096)
    pt.add_argument("--every", type=_positive, default=4096, help="tokens between checkpoints")
    pt.add_argument("--first", type=_positive, default=62_000, help="tokens of the long chain")
    pt.add_argument(
        "--others",
        type=_int_list,
        default=[76_000, 20_000],
        help="tokens of the requests that follow it",
    )
    pt.add_argument("--token-kib", type=_positive, default=32, help="K/V KiB per token")
    pt.add_argument("--state-mib", type=int, default=0, help="running state MiB per checkpoint")
    pt.add_argument("--truncate", choices=["on", "off", "both"], default="both")
    pt.add_argument("--json", action="store_true")
    pt.set_defaults(func=cmd_sim_park_truncate)
    lr = scenario("low-ram", help="a rejected park spills to disk")
    lr.add_argument("--slots", type=_positive, default=4)
    lr.add_argument("--conversations", type=_positive, default=6)
    lr.add_argument("--requests", type=_positive, default=40)
    lr.add_argument("--scale", type=_positive, default=256, help="bytes are divided by this")
    lr.add_argument("--seed", type=int, default=0)
    lr.add_argument("--dir", help="where the disk levels go (default: a temporary directory)")
    lr.add_argument("--json", action="store_true")
    lr.set_defaults(func=cmd_sim_low_ram)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _global_options() -> argparse.ArgumentParser:
    """The options every command also takes after its name (``strata fsck --config FILE``):
    their default SUPPRESS leaves the value given before the name in place, so either position
    works, and one given after the name wins."""
    g = argparse.ArgumentParser(add_help=False)
    g.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="a TOML config (what strata init writes); the same as --config before the command",
    )
    return g


def build_parser() -> argparse.ArgumentParser:
    common = [_global_options()]
    p = argparse.ArgumentParser(
        prog="strata",
        description="stratastore: durable, tiered, validated storage for LLM conversation state",
    )
    p.add_argument("--version", action="version", version=f"strata {__version__}")
    p.add_argument("--config", metavar="FILE",
                   help="a TOML config (strata init writes one): its level directories are the "
                   "default DIRs of fsck, conformance, inspect and monitor; demo takes its "
                   "settings but keeps its own small levels (also accepted after "
                   "COMMAND)")  # fmt: skip
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    command = functools.partial(sub.add_parser, parents=common)  # each takes --config too
    demo = command("demo", help="run the end-to-end demo (the main job of `make demo`)")
    demo.add_argument("--dir", help="store directory to use (default: a temporary one)")
    demo.add_argument(
        "--requests", type=_positive, default=60, help="requests to serve (default 60)"
    )
    demo.set_defaults(func=cmd_demo)
    ins = command("inspect", help="list the segments of a store's levels")
    ins.add_argument("dirs", nargs="*", metavar="PATH",
                     help="the store as fsck takes it: its root directory, a level directory or "
                     "its config file (default: --config's levels)")  # fmt: skip
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.set_defaults(func=cmd_inspect)
    _add_sim(command, common)
    rp = command("replay", help="seeds 004 and 001 through the Store, turn by turn, "
                 "beside the simulator and the seeds' tables")  # fmt: skip
    rp.add_argument("--dir", help="where seed 004's disk levels go (default: a temporary one)")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_replay)
    fk = command("fsck", help="check store directories offline (read-only)")
    fk.add_argument("dirs", nargs="*", metavar="PATH",
                    help="the store: its root directory (holding warm/ and cold/), a level "
                    "directory or its config file (default: --config's levels)")  # fmt: skip
    fk.add_argument("--deep", action="store_true", help="re-hash every page (default: sample)")
    fk.add_argument("--json", action="store_true")
    fk.add_argument("--repair", action="store_true",
                    help="fix what can be fixed without losing valid data (offline)")  # fmt: skip
    fk.add_argument("--yes", action="store_true", help="confirm --repair without asking")
    fk.add_argument("--remote", action="store_true",
                    help="check the remote level of --config (remote_url, remote_name) instead: "
                    "its namespaces only, never another key on the server")  # fmt: skip
    fk.set_defaults(func=cmd_fsck)
    cf = command("conformance", help="check directories against the spec's MUST clauses")
    cf.add_argument("dirs", nargs="*", metavar="PATH",
                    help="a store written by any implementation: its root directory, a level "
                    "directory or its config file (default: --config's levels)")  # fmt: skip
    cf.add_argument("--json", action="store_true")
    cf.set_defaults(func=cmd_conformance)
    mon = command("monitor", help="what a store's levels hold and its Store's counters")
    mon.add_argument("dir", nargs="?",
                     help="a store level directory, or the folder holding its levels (default: "
                     "--config's levels)")  # fmt: skip
    mon.add_argument("--once", action="store_true",
                     help="print the table once (default: a live view; --json and --prometheus "
                     "always print once)")  # fmt: skip
    fmt = mon.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--prometheus", action="store_true")
    mon.add_argument("--interval", type=float, default=1.0,
                     help="seconds between refreshes, more than 0 (default 1)")  # fmt: skip
    mon.set_defaults(func=cmd_monitor)
    ini = command("init", help="measure this machine, ask a few questions, write a config")
    ini.add_argument("--yes", action="store_true", help="ask nothing: write the defaults")
    ini.add_argument("--output", default="strata.toml", help="where to write (strata.toml)")
    ini.add_argument("--model-size", choices=sorted(MODEL_SIZES),
                     help="the model, for the estimates it prints (asked otherwise)")  # fmt: skip
    ini.add_argument("--force", action="store_true", help="replace an existing file")
    ini.set_defaults(func=cmd_init)
    bench = command("bench", help="validated restore vs raw read and np.load, hot and cold")
    bench.add_argument("--dir", help="where to write the image (default: a temporary directory)")
    bench.add_argument("--mib", type=_positive, default=1024, help="image size (default 1024)")
    bench.add_argument("--rounds", type=_positive, default=3)
    bench.add_argument("--hot-only", action="store_true", help="skip the cold-cache reads")
    bench.add_argument("--json", action="store_true")
    bench.add_argument(
        "--peers",
        action="store_true",
        help="durable write and reads in the engine layout vs the disk's limits, numpy, "
        "safetensors, torch and LMCache (those installed), issue 13's protocol",
    )
    bench.add_argument(
        "--lmcache",
        action="store_true",
        help="LMCache with its local disk backend (+ fsync) beside LMCache with the stratastore "
        "plugin: durable store, retrieve hot and cold, 50%% prefix (issue 16; the lmcache extra)",
    )
    bench.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        args.store_config = StoreConfig.from_toml(args.config) if args.config else None
        return int(args.func(args))
    except StrataError as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `strata ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
