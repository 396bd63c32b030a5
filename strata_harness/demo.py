"""``strata demo``: the main job: a multi-conversation agent workload on RAM + warm + cold.

An engine with 4 slots serves 8 agent conversations that share a system prompt, on a model with
Llama-3.2-1B's K/V geometry (16 layers x 8 kv heads x 64 dims, fp16: 32 KiB a token). Each
request continues a conversation (a tool result and a reply), sometimes after rewriting its last
turn; when a slot is reused the conversation leaving it is parked, and a returning one is
restored from wherever it is: the RAM level, the warm disk level or the cold one (every disk page
BLAKE3-validated, every restored byte checked here against the K/V the model would recompute).
RAM is small on purpose so conversations spill to warm, and warm small so they degrade to cold.
At the end one byte is damaged on disk in a segment a restore reads (a cold one when there is
one; :func:`damage_target`), whatever the request count: the restore of that conversation stops
at the damaged segment instead of returning bad bytes, and fsck finds exactly it. With the
``transformers`` extra a tiny Llama serves three conversations through the transformers adapter;
with the ``llamacpp`` extra llama.cpp serves the agent-edit, park-truncate and low-RAM episodes of
``strata sim`` (:mod:`strata_harness.demo_llamacpp`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from strata_harness.demo_llamacpp import run_llamacpp_phase
from stratastore.chain import Checkpoint, Conversation, as_tokens, enforce_count
from stratastore.config import StoreConfig
from stratastore.facade import Store
from stratastore.format import ModelFingerprint, data_name

__all__ = ["damage_target", "run_demo"]

SLOTS = 4
CONVERSATIONS = 8
SYSTEM_TOKENS = 512
CHECKPOINTS = 6


def _kv(
    fp: ModelFingerprint, tokens: npt.NDArray[np.uint32], start: int = 0
) -> npt.NDArray[np.uint8]:
    """The K/V a deterministic model computes for ``tokens`` at positions start...: equal
    prefixes give equal bytes, which is what makes stored prefixes shareable."""
    pos = np.arange(start, start + len(tokens), dtype=np.uint32)
    base = ((tokens * np.uint32(2654435761) + pos) >> np.uint32(7)).astype(np.uint8)
    ramp = np.arange(fp.token_bytes, dtype=np.uint8)
    return (base[:, None] + ramp[None, :]).reshape(-1)


class _Engine:
    def __init__(self, store: Store, fp: ModelFingerprint, rng: np.random.Generator) -> None:
        self.store, self.fp, self.rng = store, fp, rng
        self.system = rng.integers(0, 128_000, SYSTEM_TOKENS).astype(np.uint32)
        self.history: dict[int, npt.NDArray[np.uint32]] = {}
        self.ckpts: dict[int, list[Checkpoint]] = {}
        self.openers: dict[int, list[int]] = {}  #: message openers: the segment cuts
        self.live: list[int] = []
        self.kv: dict[int, npt.NDArray[np.uint8]] = {}
        self.tick = 0
        self.reread = self.restored = self.no_cache = self.prefilled = 0
        self.restore_s = 0.0
        self.restore_bytes = 0
        #: tokens restored, by where they came from (pending: a park whose write was in flight)
        self.served = {"ram": 0, "pending": 0, "disk": 0}
        self._restore_buf = np.zeros(0, np.uint8)
        self.free_slots = list(range(SLOTS))  #: the engine's slots no conversation holds
        self.slot_of: dict[int, int] = {}  #: a live conversation -> its slot

    def request(self, c: int) -> None:
        self.tick += 1
        prev = self.history.get(c, self.system)
        if c in self.history and self.rng.random() < 0.15 and len(self.ckpts[c]) > 2:
            prev = prev[: self.ckpts[c][-2].length]  # the agent rewrites its last turn
        turn = self.rng.integers(0, 128_000, int(self.rng.integers(120, 700))).astype(np.uint32)
        prompt = np.concatenate([prev, turn])
        self.no_cache += len(prev)
        if c in self.live:
            self.live.remove(c)
            kv = self.kv[c]
            have = self._common(self.history[c], prompt)
        else:
            if len(self.live) >= SLOTS:
                self._park(self.live.pop(0))
            kv = self._buffer(len(prompt) * self.fp.token_bytes)
            self.slot_of[c] = self.free_slots.pop(0)
            t = time.perf_counter()
            r = self.store.restore(prompt, kv, slot=self.slot_of[c])
            self.restore_s += time.perf_counter() - t
            self.restore_bytes += r.tokens * self.fp.token_bytes
            have = r.tokens
            want = _kv(self.fp, prompt[:have])
            if not np.array_equal(kv[: have * self.fp.token_bytes], want):
                raise AssertionError(f"conversation {c}: restored bytes differ from the model's")
            self.restored += have
            if r.source != "none":
                self.served[r.source] = self.served.get(r.source, 0) + have
            self.reread += len(prev) - min(have, len(prev))
        # the engine prefills what it does not have, then keeps a checkpoint at the turn start
        tb = self.fp.token_bytes
        full = np.empty(len(prompt) * tb, dtype=np.uint8)
        full[: have * tb] = kv[: have * tb]
        full[have * tb :] = _kv(self.fp, prompt[have:], have)
        self.prefilled += len(prompt) - have
        chain = [
            x
            for x in self.ckpts.get(c, [Checkpoint(SYSTEM_TOKENS, pinned=True)])
            if x.length <= have or x.length == SYSTEM_TOKENS
        ]
        chain.append(Checkpoint(len(prompt), last_used=self.tick))
        enforce_count(chain, CHECKPOINTS, "spread")
        openers = [x for x in self.openers.get(c, [0, SYSTEM_TOKENS]) if x <= len(prev)]
        self.openers[c] = sorted({*openers, len(prev)})
        self.history[c], self.ckpts[c], self.kv[c] = prompt, chain, full
        self.live.append(c)

    def _buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """The restore target: one buffer touched once and reused, as an engine's K/V is."""
        if self._restore_buf.size < nbytes:
            self._restore_buf = np.zeros(max(nbytes, 2 * self._restore_buf.size), np.uint8)
        return self._restore_buf[:nbytes]

    @staticmethod
    def _common(a: npt.NDArray[np.uint32], b: npt.NDArray[np.uint32]) -> int:
        n = min(len(a), len(b))
        neq = a[:n] != b[:n]
        return int(neq.argmax()) if neq.any() else n

    def _park(self, c: int) -> None:
        tokens = self.history[c]
        ckpts = [Checkpoint(x.length, pinned=x.pinned) for x in self.ckpts[c]]
        conv = Conversation(f"agent-{c}", as_tokens(tokens), ckpts, cuts=self.openers[c])
        slot = self.slot_of.pop(c)
        self.store.park(conv, self.kv.pop(c), slot=slot)
        self.free_slots.append(slot)

    def park_all(self) -> None:
        while self.live:
            self._park(self.live.pop(0))


def _bar(done: int, total: int, info: str) -> None:
    """The progress bar: redrawn in place on a terminal; elsewhere (a log, a pipe) a line at
    each tenth of the way and at the end, with no carriage return."""
    width = 30
    fill = width * done // total
    line = f"  [{'#' * fill}{'.' * (width - fill)}] {done}/{total} {info}"
    if sys.stdout.isatty():
        sys.stdout.write(f"\r{line}" + ("\n" if done == total else ""))
    elif done == total or 10 * done // total != 10 * (done - 1) // total:
        sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def run_demo(
    path: str, requests: int, base: StoreConfig | None = None, *, kept: bool = True
) -> int:
    """Run the demo in ``path``. ``base`` (a user's config): its settings are used, except the
    RAM budget and the levels, which the demo sizes small itself to show spills and cascades."""
    fp = ModelFingerprint.create(
        "demo/llama-3.2-1b-geometry",
        n_layers=16,
        n_kv_heads=8,
        head_dim=64,
        page_tokens=16,
        dtype="float16",
    )
    cfg: dict[str, Any] = {
        **(base.to_mapping() if base else {}),
        **{
            "ram_mib": 128,
            "slots": SLOTS,
            "spill_on": "evict",
            "levels": (),
            "warm_dir": os.path.join(path, "warm"),
            "warm_mib": 192,
            "cold_dir": os.path.join(path, "cold"),
            "cold_mib": 1024,
        },
    }
    print(
        f"strata demo: {CONVERSATIONS} agent conversations, {SLOTS} slots, {requests} "
        f"requests, in {path}"
    )
    print(
        f"  model: {fp.describe()}, {fp.token_bytes // 1024} KiB/token; RAM "
        f"{cfg['ram_mib']} MiB, warm {cfg['warm_mib']} MiB, cold {cfg['cold_mib']} MiB"
    )
    _write_root_config(path, cfg)
    rng = np.random.default_rng(7)
    t0 = time.perf_counter()
    with Store.open(fp, cfg) as store:
        engine = _Engine(store, fp, rng)
        for i in range(requests):
            engine.request(int(rng.integers(CONVERSATIONS)))
            _bar(i + 1, requests, f"re-read {engine.reread:,} of {engine.no_cache:,} tokens")
        engine.park_all()
        store.flush()
        print(f"  done in {time.perf_counter() - t0:.1f} s")
        damage = _damage_check(store, cfg, fp)
        stats = store.stats()
        info = store.info_line()
    print(f"  {info}")
    verdict, ok = _fsck_verdict(cfg, damage)
    _report(stats, engine, verdict)
    if damage is not None:
        print(f"  one byte flipped in a segment on disk -> {damage[2]}")
    real = _real_model_phase(os.path.join(path, "hf"))
    llama = run_llamacpp_phase(os.path.join(path, "llama"))
    if kept:
        print(f"  strata monitor {path} --once   shows the levels and these counters")
    else:
        print("  (the directory is temporary: strata demo --dir DIR keeps it for strata monitor)")
    return 0 if ok and real and llama and (damage is None or damage[3]) else 1


def _write_root_config(path: str, cfg: dict[str, Any]) -> None:
    """``path/strata.toml``: the demo store's config, so ``strata fsck path`` (and monitor,
    conformance) know its levels are the whole store
    (:data:`~stratastore.ops.level_dirs.ROOT_CONFIG`). A file already there is left as it is."""
    from stratastore.io import files
    from stratastore.ops.installer import write_config
    from stratastore.ops.level_dirs import ROOT_CONFIG

    target = os.path.join(path, ROOT_CONFIG)
    if not os.path.lexists(target):
        store_cfg = StoreConfig.from_mapping(cfg, "the demo's settings")
        files.makedirs(path, mode=store_cfg.file_mode)  # private, like the store's levels
        write_config(store_cfg, target)


def _report(s: dict[str, Any], e: _Engine, verdict: str) -> None:
    lv = s["levels"]
    print()
    print(f"  {'level':<6}{'served':>8}{'moved down':>12}{'deleted':>9}{'entries':>9}{'MiB':>8}")
    ram = lv["ram"]
    print(
        f"  {'ram':<6}{s['hits_ram']:>8}{s['evict_spills']:>12}"
        f"{ram['evictions'] - s['evict_spills']:>9}{ram['entries']:>9}"
        f"{ram['bytes'] / 2**20:>8.0f}"
    )
    for name in ("warm", "cold"):
        d = lv[name]
        down = d["degradations"] if name == "warm" else "-"
        print(
            f"  {name:<6}{d['hits']:>8}{down:>12}"
            f"{d['disk_evictions'] + d['age_evictions'] + d['discards']:>9}{d['entries']:>9}"
            f"{d['bytes'] / 2**20:>8.0f}"
        )
    print()
    gbs = e.restore_bytes / e.restore_s / 1e9 if e.restore_s else 0.0
    rows = [
        (
            "tokens served from RAM / disk",
            f"{e.served['ram'] + e.served['pending']:,} / {e.served['disk']:,}",
        ),
        ("  of them, parks in flight", f"{e.served['pending']:,}"),
        ("tokens re-read (history)", f"{e.reread:,}"),
        ("tokens re-read without a cache", f"{e.no_cache:,}"),
        ("parks to RAM / disk", f"{s['parks_ram']} / {s['parks_disk']}"),
        ("RAM evictions spilled to disk", f"{s['evict_spills']}"),
        ("discards", f"{s['discards']}"),
        ("ladder restores", f"{s['ladder_restores']}"),
        ("restore GB/s (validated)", f"{gbs:.2f}"),
        ("fsck", verdict),
    ]
    for k, v in rows:
        print(f"  {k:<34}{v:>14}")


def damage_target(store: Store) -> tuple[npt.NDArray[np.uint32], int, str, str] | None:
    """A segment a restore will read: ``(prompt, its first token, its data file, its level)``.

    For each conversation on disk, the restore of its own tokens is what :meth:`Store.lookup`
    answers: it must come from disk (a RAM copy as deep would serve it instead), and it reads
    the chain of the conversation that lookup names from its first segment up to the match,
    stopping at the first segment that capacity GC removed. So the victim is a segment of that
    chain, not its first (the shared system prompt), below the match, with every segment before
    it present; a cold one when there is one (the demo's point: the last level), else a warm
    one. ``None`` when no conversation on disk has such a segment."""
    tiers = store._tiers
    found: dict[str, tuple[npt.NDArray[np.uint32], int, str, str]] = {}
    tiers.view.sync()  # the catalog as this process sees it now
    on_disk = dict(tiers.view.convs)
    for dc in on_disk.values():
        hit = tiers.lookup(dc.conv.tokens)
        if hit is None or hit[0] != "disk":
            continue
        match = hit[1]
        for start, _, key in on_disk[match.conv_id].segments:
            holder = tiers.holder(key)
            if start >= match.length or holder is None:
                break  # the restore stops here: nothing deeper is read
            level = next(lv.name for lv in tiers.levels if lv.store is holder)
            path = os.path.join(holder.path, data_name(key))
            if start > 0:
                found.setdefault(level, (dc.conv.tokens, start, path, level))
        if "cold" in found:
            break
    return found.get("cold") or found.get("warm")


def _save_for_damage(store: Store, fp: ModelFingerprint) -> None:
    """Save a conversation of three turns on disk (a session: durable when saved), for a run
    too short to have moved anything out of RAM; its turns are its own, so only a disk restore
    serves it."""
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, 128_000, SYSTEM_TOKENS + 3 * 256).astype(np.uint32)
    turns = [SYSTEM_TOKENS + 256 * i for i in range(3)]
    store.save_session("demo-damage-check", tokens, _kv(fp, tokens), checkpoints=turns)


def _damage_check(
    store: Store, cfg: dict[str, Any], fp: ModelFingerprint
) -> tuple[str, int, str, bool] | None:
    """Damage one byte of a segment that a restore reaches (:func:`damage_target`) and restore
    the conversation: (damaged file, its first token, what happened, detected)."""
    target = damage_target(store)
    if target is None:  # a short run kept everything in RAM: put a conversation on disk first
        _save_for_damage(store, fp)
        target = damage_target(store)
    if target is None:
        print("  damage check: no segment on disk that a restore reads")
        return None
    prompt, start, path, level = target
    _flip_byte(path, 4096 + 9)
    out = np.empty(len(prompt) * fp.token_bytes, dtype=np.uint8)
    r = store.restore(prompt, out)
    good = r.tokens <= start
    what = "DAMAGE NOT DETECTED"
    if good:
        what = (
            f"restored {r.tokens:,} of {len(prompt):,} tokens, stopping at the damaged "
            f"segment (token {start:,}, {level} level)"
        )
    return path, start, what, good


def _fsck_verdict(
    cfg: dict[str, Any], damage: tuple[str, int, str, bool] | None
) -> tuple[str, bool]:
    """fsck of both levels after the run: exactly the damaged segment, or nothing."""
    from stratastore.ops.fsck import fsck

    errors = [f for f in fsck([cfg["warm_dir"], cfg["cold_dir"]]) if f.severity == "error"]
    if damage is None:
        return ("clean", True) if not errors else (f"{len(errors)} errors", False)
    key = os.path.basename(damage[0]).removeprefix("strata-conv-").removesuffix(".seg")
    # by key: the damaged segment may have moved down a level since (close() writes what only
    # RAM held, and the cascade makes room), and its index record names the key alone
    ours = [f for f in errors if f.object == damage[0] or key in os.path.basename(f.object)]
    ids = ", ".join(sorted({f.id for f in errors}))
    if ours and len(ours) == len(errors):  # the data file, and its index record
        return f"only the flipped byte: {ids}", True
    return f"{len(errors)} errors: {ids}", False


def _real_model_phase(path: str) -> bool:
    """With the ``transformers`` extra: a randomly initialised tiny Llama (no download) serves
    three conversations of three turns through the adapter, RAM holding only one, so the others
    come back from the cold level; each continuation's logits must equal, bit for bit, those on
    the cache the model computed itself."""
    try:
        import torch
        import transformers
    except ImportError:
        print(
            "  real model: the transformers extra is not installed (pip install -e "
            "'.[transformers]' adds a tiny Llama phase)"
        )
        return True
    import copy

    from stratastore.adapters.hf import TransformersCache

    cfg = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(cfg)
    model.eval()
    gen = torch.Generator().manual_seed(1)
    store_cfg = {
        "ram_mib": 1,
        "slots": 1,
        "min_free_mib": 1,
        "park_min_free_mib": 1,
        "spill_on": "evict",
        "cold_dir": os.path.join(path, "cold"),
        "cold_mib": 64,
        "create_dirs": True,
    }
    history = {c: torch.randint(0, 1000, (1, 200), generator=gen) for c in range(3)}
    kept: dict[int, Any] = {}
    restored = worst = 0
    sources: dict[str, int] = {}
    with (
        TransformersCache.open(
            cfg, "demo/tiny-llama@seed0", store_cfg, dtype=torch.float32, probe=lambda: 1 << 40
        ) as kv,
        torch.no_grad(),
    ):
        for turn in range(3):
            for c in range(3):
                ids = history[c]
                if turn:
                    hit = kv.store.lookup(ids[0].numpy())
                    src = hit[0] if hit else "none"
                    sources[src] = sources.get(src, 0) + 1
                    cache, n = kv.restore(ids)
                    restored += n
                    base = copy.deepcopy(kept[c])
                    got = model(input_ids=ids[:, n:], cache=cache, use_cache=True)
                    want = model(input_ids=ids[:, n:], cache=base, use_cache=True)
                    worst = max(worst, int((got.logits != want.logits).sum()))
                    cache = got.cache
                else:
                    cache = model(input_ids=ids, use_cache=True).cache
                kept[c] = copy.deepcopy(cache)
                kv.park(f"chat-{c}", ids, cache, checkpoints=[ids.shape[1]])
                history[c] = torch.cat([ids, torch.randint(0, 1000, (1, 60), generator=gen)], 1)
    ok = worst == 0 and restored > 0
    same = "bit-identical to those on the model's own cache" if ok else "DIFFER"
    print(
        f"  real model: tiny Llama via transformers, 3 conversations x 3 turns: {restored:,} "
        f"tokens restored (restores by source: {sources}); continued logits {same}"
    )
    return ok


def _flip_byte(path: str, offset: int) -> None:
    """Damage a file in place, as a bad disk would: deliberately outside the io layer."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))
