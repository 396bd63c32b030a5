"""``strata init``: the installer's questions, and the config file it writes.

It measures the machine (free RAM, cores; the write+fsync and read speed of a directory chosen
for a disk level), then asks what the defaults cannot know: the model's size, **one request or
several** (the slots) and **whether conversations are kept on disk** (the levels and their
budgets), the RAM budget, and after those two questions **the context size** in tokens (Enter:
the model's, ``context_tokens = 0``); and writes a TOML config (its levels as ``[[levels]]``
tables) that ``Store.open(fp, path)`` and every CLI command (``--config``) read. The
measurements and the model (its K/V a token, its context) only inform the suggestions it
prints: **no answer means the default**, so Enter at every prompt, like ``--yes`` (which asks
nothing), writes exactly :class:`~stratastore.StoreConfig`'s defaults, on any machine, for any
model.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from stratastore.config import LevelSpec, StoreConfig
from stratastore.config.aliases import flat_mapping
from stratastore.errors import ConfigError
from stratastore.io import durable_write, files, pathnames
from stratastore.io.system import (
    cache_home,
    cpu_count,
    mem_available,
    random_bytes,
    this_process,
)

__all__ = [
    "MODEL_SIZES",
    "Machine",
    "ModelSize",
    "measure_dir",
    "measure_machine",
    "run_init",
    "to_toml",
]

MIB = 1 << 20


class ModelSize(NamedTuple):
    """What the installer's estimates know of a model size."""

    kv_bytes: int  #: K/V bytes a token (fp16/bf16, grouped-query attention)
    context: int  #: the context it was trained for, in tokens


#: common sizes, Llama-3 shapes (layers x K/V heads x head_dim x K and V x 2 bytes)
MODEL_SIZES = {
    "1b": ModelSize(16 * 8 * 64 * 2 * 2, 131_072),  # Llama-3.2-1B: 32 KiB
    "3b": ModelSize(28 * 8 * 128 * 2 * 2, 131_072),  # Llama-3.2-3B: 112 KiB
    "8b": ModelSize(32 * 8 * 128 * 2 * 2, 131_072),  # Llama-3.1-8B: 128 KiB
    "70b": ModelSize(80 * 8 * 128 * 2 * 2, 131_072),  # Llama-3.1-70B: 320 KiB
    "405b": ModelSize(126 * 8 * 128 * 2 * 2, 131_072),  # Llama-3.1-405B: 504 KiB
}


@dataclass(frozen=True)
class Machine:
    free_ram: int  #: bytes
    cores: int


def measure_machine(probe: Callable[[], int] = mem_available) -> Machine:
    return Machine(probe(), cpu_count())


def measure_dir(path: str, mib: int = 64) -> tuple[float, float]:
    """(write+fsync MB/s, read MB/s) of ``mib`` MiB in ``path``, through the io layer; the file
    is removed afterwards. The read is of a just-written file, so it may come from the cache."""
    files.makedirs(path)
    target = pathnames.join(path, f".strata-init-probe-{this_process()}")
    data = random_bytes(mib * MIB)
    t = time.perf_counter()
    durable_write(target, data)
    w = time.perf_counter() - t
    try:
        t = time.perf_counter()
        files.read_file(target, len(data))
        r = time.perf_counter() - t
    finally:
        files.unlink(target, missing_ok=True)
    return len(data) / w / 1e6, len(data) / r / 1e6


def _choice(
    ask: Callable[[str], str], question: str, options: tuple[str, ...], default: str
) -> str:
    while True:
        got = ask(f"{question} [{'/'.join(options)}, Enter: {default}] ").strip().lower()
        if not got:
            return default
        if got in options:
            return got


def _number(
    ask: Callable[[str], str],
    say: Callable[[str], None],
    question: str,
    default: int,
    low: int = 0,
    shown: str | None = None,
) -> int:
    """A whole number of at least ``low``, asked again until it is one; Enter is ``default``
    (``shown`` says what that means, when not the number itself)."""
    while True:
        got = ask(f"{question} [Enter: {default if shown is None else shown}] ").strip()
        if not got:
            return default
        try:
            value = int(got)
        except ValueError:
            say(f"  {got!r} is not a whole number")
            continue
        if value < low:
            say(f"  at least {low}, please")
            continue
        return value


def run_init(
    *,
    yes: bool,
    ask: Callable[[str], str],
    say: Callable[[str], None],
    machine: Machine,
    model_size: str | None = None,
    measure: Callable[[str], tuple[float, float]] = measure_dir,
) -> StoreConfig:
    """The installer flow; returns the config to write. ``yes`` asks and measures nothing."""
    defaults = StoreConfig()
    if yes:
        return defaults
    say(f"this machine: {machine.free_ram / 2**30:.1f} GiB of RAM free, {machine.cores} cores")
    if model_size is None:
        model_size = _choice(ask, "model size?", tuple(MODEL_SIZES), "8b")
    per_token, model_context = MODEL_SIZES[model_size]
    say(f"  a {model_size} model's K/V: {per_token // 1024} KiB a token")
    values: dict[str, Any] = {}
    several = _choice(
        ask, "serve one request at a time, or several?", ("one", "several"), "several"
    )
    if several == "one":
        values["slots"] = 1
    else:
        values["slots"] = _number(ask, say, "  how many at once (slots)?", defaults.slots, 1)
    room = max(0, machine.free_ram - defaults.min_free_mib * MIB)
    say(
        f"  RAM for parked conversations: the default {defaults.ram_mib:,} MiB holds about "
        f"{defaults.ram_mib * MIB // per_token:,} tokens; this machine can spare about "
        f"{room // MIB:,} MiB beside the {defaults.min_free_mib:,} MiB parking floor"
    )
    values["ram_mib"] = _number(ask, say, "  RAM budget in MiB?", defaults.ram_mib)
    disk = _choice(
        ask,
        "keep conversations on disk (they survive restarts, and a park RAM "
        "cannot take spills there)?",
        ("no", "yes"),
        "no",
    )
    levels: list[LevelSpec] = []
    if disk == "yes":
        # the directory a cold level given a budget alone is kept in (the user's cache)
        here = pathnames.join(cache_home() or pathnames.abspath("."), "stratastore")
        d = ask(f"  directory for the disk level [Enter: {here}] ").strip() or here
        write, read = measure(d)
        say(f"  {d}: write+fsync {write:,.0f} MB/s, read {read:,.0f} MB/s")
        cold = pathnames.abspath(d)
        levels.append(LevelSpec("cold", cold, _number(ask, say, "  its budget in MiB?", 65536, 1)))
        if (
            _choice(
                ask, "  a faster warm level in front of it (another disk)?", ("no", "yes"), "no"
            )
            == "yes"
        ):
            w = ask("  directory for the warm level: ").strip()
            if w:
                write, read = measure(w)
                say(f"  {w}: write+fsync {write:,.0f} MB/s, read {read:,.0f} MB/s")
                mib = _number(ask, say, "  its budget in MiB?", 16384, 1)
                levels.insert(0, LevelSpec("warm", pathnames.abspath(w), mib))  # parks go first
    values["context_tokens"] = _context(ask, say, model_size, values, model_context, per_token)
    return StoreConfig(**values, levels=levels)


def _context(
    ask: Callable[[str], str],
    say: Callable[[str], None],
    model_size: str,
    values: dict[str, Any],
    model_context: int,
    per_token: int,
) -> int:
    """The context size question, after the slots and the disk: Enter keeps the default,
    ``0`` (the model's context). Says how many full contexts the RAM budget holds for the
    slots asked (``values``)."""
    say(
        f"  a {model_size} model's context is {model_context:,} tokens: "
        f"{model_context * per_token / 2**30:.1f} GiB of K/V for a full one"
    )
    tokens = _number(
        ask, say, "context size in tokens?", 0, shown=f"the model's, {model_context:,}"
    )
    full = (tokens or model_context) * per_token
    held = values["ram_mib"] * MIB // full
    say(
        f"  the RAM budget ({values['ram_mib']:,} MiB) holds {held:,} full contexts of "
        f"{tokens or model_context:,} tokens for {values['slots']} slots"
        + (
            ""
            if held >= values["slots"]
            else ": fewer than the slots (a park RAM cannot take goes to disk, when there is one)"
        )
    )
    return tokens


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else str(v)  # a JSON string is a TOML one


def to_toml(cfg: StoreConfig) -> str:
    """``cfg`` as TOML, in sections: every top-level setting as ``name = value``, then each
    level as a ``[[levels]]`` table (its ``settings`` as ``[levels.settings]`` after it). A
    level the sections cannot spell (one the flat settings switch off by leaving its
    location empty, ``cold_mib = 5`` alone) is written by its flat settings among the
    top-level ones, with the others of its kind. The defaults have no level: nothing about
    one is written. Reads back (:meth:`StoreConfig.from_toml`) as an equal config."""
    lines = [
        "# stratastore config, written by `strata init`; Store.open(fp, this path) and",
        "# `strata ... --config this path` read it. See docs/configuration.md.",
        "",
    ]
    disk = tuple(s for s in cfg.specs if not s.shared)
    remote = tuple(s for s in cfg.specs if s.shared)
    flat: tuple[LevelSpec, ...] = ()
    if any(not (s.dir or s.url) for s in disk):
        flat += disk
    if any(not s.url for s in remote):
        flat += remote
    top = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "specs"}
    for name, v in {**top, **flat_mapping(flat)}.items():
        text = f"{v:#o}" if name == "file_mode" else _toml_value(v)  # permission bits: octal
        lines.append(f"{name} = {text}")
    for level in (s for s in cfg.specs if s not in flat):
        table = level.to_mapping()
        settings = table.pop("settings", {})
        lines += ["", "[[levels]]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
        if settings:
            lines += ["", "[levels.settings]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def write_config(cfg: StoreConfig, path: str, *, force: bool = False) -> None:
    """Write ``cfg`` to ``path`` durably; refuses to replace a file unless ``force``."""
    if files.exists(path) and not force:
        raise ConfigError(f"{path} exists; pass --force to replace it, or --output another file")
    durable_write(path, to_toml(cfg).encode())
    back = StoreConfig.from_toml(path)  # what we wrote is what Store.open will read
    if back != cfg:
        raise ConfigError(f"{path} does not read back as written; please report this")
