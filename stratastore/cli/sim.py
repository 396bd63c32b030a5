"""``strata sim SCENARIO``: replay a workload against the real policy code, costed in tokens
re-read (:mod:`strata_harness.sim`, loaded only when a scenario runs).

Scenarios: ``agent-edit`` (retention against an edit back in a long conversation's history),
``edit-sweep`` (its re-reads under least recent use, spread retention and page-granular
resume, for several edits), ``park-truncate`` (a park keeps the prefix that fits the RAM
budget) and ``low-ram`` (a park the RAM level rejects spills to disk, under the old admission
rule and the new one).
"""

from __future__ import annotations

import argparse
import json
import tempfile

from stratastore.cli.common import (
    AddCommand,
    absolute,
    global_options,
    int_list,
    positive,
    print_rows,
)

__all__ = ["add_parser", "agent_edit", "edit_sweep", "low_ram", "park_truncate"]


def add_parser(command: AddCommand) -> None:
    sim = command("sim", help="replay a workload against the real policy code")
    scen = sim.add_subparsers(dest="scenario", metavar="SCENARIO", required=True)

    def scenario(name: str, help: str) -> argparse.ArgumentParser:
        return scen.add_parser(name, help=help, parents=[global_options()])

    ae = scenario("agent-edit", help="retention against an edit back in history")
    _agent_args(ae, "6000")
    ae.add_argument("--policy", choices=["spread", "lru"], default="spread")
    ae.add_argument(
        "--layout",
        choices=["hybrid", "attention"],
        default="hybrid",
        help="attention: resume on any whole page, not only on checkpoints",
    )
    ae.set_defaults(func=agent_edit)
    sw = scenario("edit-sweep", help="re-read tokens of lru, spread and page resume")
    _agent_args(sw, "1000,2000,4000,6000,8000,16000,32000,42000,64000,100000,150000")
    sw.set_defaults(func=edit_sweep)
    pt = scenario("park-truncate", help="park the prefix that fits")
    pt.add_argument("--budget-mib", type=positive, default=3500)
    pt.add_argument("--slots", type=positive, default=2)
    pt.add_argument("--min-tokens", type=int, default=4096)
    pt.add_argument("--every", type=positive, default=4096, help="tokens between checkpoints")
    pt.add_argument("--first", type=positive, default=62_000, help="tokens of the long chain")
    pt.add_argument(
        "--others",
        type=int_list,
        default=[76_000, 20_000],
        help="tokens of the requests that follow it",
    )
    pt.add_argument("--token-kib", type=positive, default=32, help="K/V KiB per token")
    pt.add_argument("--state-mib", type=int, default=0, help="running state MiB per checkpoint")
    pt.add_argument("--truncate", choices=["on", "off", "both"], default="both")
    pt.add_argument("--json", action="store_true")
    pt.set_defaults(func=park_truncate)
    lr = scenario("low-ram", help="a rejected park spills to disk")
    lr.add_argument("--slots", type=positive, default=4)
    lr.add_argument("--conversations", type=positive, default=6)
    lr.add_argument("--requests", type=positive, default=40)
    lr.add_argument("--scale", type=positive, default=256, help="bytes are divided by this")
    lr.add_argument("--seed", type=int, default=0)
    lr.add_argument("--dir", help="where the disk levels go (default: a temporary directory)")
    lr.add_argument("--json", action="store_true")
    lr.set_defaults(func=low_ram)


def _agent_args(p: argparse.ArgumentParser, edit_default: str) -> None:
    """The options agent-edit and edit-sweep share (the conversation and the edits)."""
    p.add_argument("--system-tokens", type=positive, default=9525)
    p.add_argument("--turns", type=positive, default=200)
    p.add_argument("--turn-tokens", type=positive, default=1000)
    p.add_argument(
        "--checkpoints",
        type=positive,
        default=6,
        help="checkpoints kept per conversation, root included",
    )
    p.add_argument(
        "--edit-back",
        type=int_list,
        default=int_list(edit_default),
        help="tokens before the end where the client rewrites history "
        "(a comma-separated list for several)",
    )
    p.add_argument("--page-tokens", type=positive, default=16)
    p.add_argument("--json", action="store_true")


def agent_edit(args: argparse.Namespace) -> int:
    """One run per ``--edit-back``: where the resume lands and the tokens re-read."""
    from strata_harness.sim import AgentEdit, run_agent_edit

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
    print_rows(
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


def edit_sweep(args: argparse.Namespace) -> int:
    """The tokens re-read per edit under lru, spread, and spread with page-granular resume."""
    from strata_harness.sim import AgentEdit, run_agent_edit

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
        print_rows(["edit back", "lru re-reads", "spread re-reads", "page-granular re-reads"], rows)
    return 0


def park_truncate(args: argparse.Namespace) -> int:
    """Each park of the scenario (what it kept, shrank, evicted), with truncation on, off or
    both, then what the first conversation's return restores."""
    from strata_harness.sim import ParkTruncate, run_park_truncate

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
        print_rows(
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


def low_ram(args: argparse.Namespace) -> int:
    """The low-RAM episode under the old admission rule and the new one, side by side; the disk
    levels in ``--dir`` (kept), else in a temporary directory."""
    from strata_harness.sim import LowRam, run_low_ram

    cfg = LowRam(args.slots, args.conversations, args.requests, args.scale, args.seed)
    if args.dir is not None:
        doc = run_low_ram(cfg, absolute(args.dir))
    else:
        with tempfile.TemporaryDirectory(prefix="strata-sim-") as d:
            doc = run_low_ram(cfg, d)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    old, new = doc["old"], doc["new"]
    print(
        f"low-ram, {args.slots} slots, {args.requests} requests, bytes scaled "
        f"1/{args.scale}, tokens at full scale:"
    )
    rows = [[k.replace("_", " "), f"{old[k]:,}", f"{new[k]:,}"] for k in old if k != "rule"]
    print_rows(["", old["rule"], new["rule"]], rows)
    return 0
