"""What identifies the model a vLLM engine serves (stratastore.adapters.vllm.identity): the
config's digest is the same in every process and blind to where the files lie, and a config
it cannot digest stably is a ConfigError naming the key; the weights' identity is the same for
the same files in another directory, and another for another tensor's header or bytes (a
fine-tune, one byte anywhere in a tensor), another .bin, or a damaged safetensors file (a
ConfigError)."""

from __future__ import annotations

import enum
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import ConfigError
from stratastore.adapters.vllm.identity import config_digest, weights_identity

# a config holding what a config may hold: sets, tuples, nested dicts, where the files lie
CONFIG_SOURCE = """{
    "_name_or_path": "/models/llama",
    "transformers_version": "4.51.0",
    "architectures": ("LlamaForCausalLM",),
    "num_hidden_layers": 2,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "pad_token_id": None,
    "id2label": {0: "LABEL_0", 1: "LABEL_1"},
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "_commit_hash": "abc"},
    "layer_kinds": {"full", "sliding", "chunked", "linear", "mamba", "moe", "x", "yy"},
    "text_config": {"transformers_version": "4.0", "heads": (8, 2), "extra": {"deep": [1, 2]}},
}"""


def _config() -> dict[str, Any]:
    out: dict[str, Any] = eval(CONFIG_SOURCE)  # the same literal the subprocess evaluates
    return out


# -- the config ---------------------------------------------------------------------------------
def test_the_config_digest_is_the_same_in_another_process() -> None:
    """Sets iterate in another order under another hash seed: the digest does not move."""
    code = (
        "import sys; from stratastore.adapters.vllm.identity import config_digest\n"
        f"sys.stdout.write(config_digest({CONFIG_SOURCE}).hex())"
    )
    here = config_digest(_config())
    assert len(here) == 16
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        assert out.stdout == here.hex()


def test_the_config_digest_ignores_where_the_files_lie_and_which_tool_wrote_them() -> None:
    base = config_digest(_config())
    moved = _config()
    moved["_name_or_path"] = "/elsewhere/llama"
    moved["_commit_hash"] = "0123"
    moved["transformers_version"] = "5.0.0"
    moved["rope_scaling"]["_commit_hash"] = "def"
    moved["text_config"]["transformers_version"] = "9"
    del moved["architectures"]
    moved["architectures"] = ["LlamaForCausalLM"]  # a tuple is a list; key order is no matter
    moved["id2label"] = {"0": "LABEL_0", "1": "LABEL_1"}  # as config.json writes the keys
    assert config_digest(moved) == base


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c.update(num_hidden_layers=3),
        lambda c: c["rope_scaling"].update(factor=4.0),
        lambda c: c["text_config"]["extra"].update(deep=[2, 1]),
        lambda c: c["layer_kinds"].discard("moe"),
        lambda c: c.update(tie_word_embeddings=True),
        lambda c: c.update(pad_token_id=0),
    ],
)
def test_a_real_change_of_the_config_changes_its_digest(change: Any) -> None:
    cfg = _config()
    change(cfg)
    assert config_digest(cfg) != config_digest(_config())


class _Act(enum.Enum):
    SILU = "silu"


def test_enums_and_torch_dtypes_are_by_name() -> None:
    assert config_digest({"act": _Act.SILU}) == config_digest({"act": "SILU"})
    torch = pytest.importorskip("torch")
    assert config_digest({"dtype": torch.bfloat16}) == config_digest({"dtype": "torch.bfloat16"})


@pytest.mark.parametrize(
    "cfg, path, kind",
    [
        ({"rope_scaling": {"x": object()}}, r'config\["rope_scaling"\]\["x"\]', "object"),
        ({"blob": b"\x00\x01"}, r'config\["blob"\]', "bytes"),
        ({"a": [1, {"b": bytearray(2)}]}, r'config\["a"\]\[1\]\["b"\]', "bytearray"),
        ({"rope_scaling": {(1, 2): 3}}, r'config\["rope_scaling"\] has the key \(1, 2\)', "tuple"),
        ({"m": {b"k": 1}}, r"config\[\"m\"\] has the key b'k'", "bytes"),
        ({"m": {0: "a", "0": "b"}}, r'config\["m"\] has the keys "0" and', ""),
    ],
)
def test_what_has_no_stable_text_is_a_config_error_naming_its_key(
    cfg: dict[str, Any], path: str, kind: str
) -> None:
    with pytest.raises(ConfigError, match=path) as got:
        config_digest(cfg)
    assert kind in str(got.value)
    assert not isinstance(got.value, TypeError)


def _looped_dict() -> dict[str, Any]:
    cfg: dict[str, Any] = {"num_hidden_layers": 2}
    cfg["text_config"] = {"heads": 8, "parent": cfg}
    return cfg


def _looped_list() -> dict[str, Any]:
    layers: list[Any] = [1, 2]
    layers.append(layers)
    return {"layers": layers}


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (_looped_dict, r'config\["text_config"\]\["parent"\]'),
        (_looped_list, r'config\["layers"\]\[2\]'),
    ],
)
def test_a_config_that_contains_itself_is_a_config_error_naming_where(make: Any, path: str) -> None:
    with pytest.raises(ConfigError, match=path + " contains itself"):
        config_digest(make())


def test_a_config_nested_past_any_models_is_a_config_error() -> None:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(5000):
        deep = {"k": deep}
    with pytest.raises(ConfigError, match="nested over 100 levels"):
        config_digest(deep)


def test_one_dict_held_twice_is_no_cycle() -> None:
    """A value shared by two keys (no cycle) digests as the two copies would."""
    shared = {"rope_type": "llama3", "factor": 8.0}
    twice = {"a": shared, "b": [shared, shared]}
    copies = {"a": dict(shared), "b": [dict(shared), dict(shared)]}
    assert config_digest(twice) == config_digest(copies)


# -- the weights --------------------------------------------------------------------------------
def _safetensors(path: Path, tensors: dict[str, np.ndarray], header_extra: Any = None) -> None:
    """A safetensors file written by hand: 8-byte length, the JSON header, the data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, at = [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        dtype = {"float16": "F16", "float32": "F32", "int8": "I8"}[str(a.dtype)]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    if header_extra:
        header_extra(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


#: a header whose one tensor needs 8 bytes of data
SHORT = b'{"t": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}'


def _model(d: Path, seed: int = 0, **kwargs: Any) -> Path:
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text('{"num_hidden_layers": 2}')
    for shard in (1, 2):
        tensors = {
            f"model.layers.{shard}.q.weight": rng.standard_normal((16, 8)).astype(np.float16),
            f"model.layers.{shard}.norm.weight": np.ones(8, np.float32),
        }
        _safetensors(d / f"model-0000{shard}-of-00002.safetensors", tensors, **kwargs)
    return d


def test_the_same_weights_in_another_directory_are_the_same_model(tmp_path: Path) -> None:
    a = _model(tmp_path / "a")
    b = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(a, b)
    (b / "README.md").write_text("not weights")
    got = weights_identity(str(a), None)
    assert got.startswith("weights:") and len(got) == len("weights:") + 32
    assert weights_identity(str(b), "main") == got  # the revision names no local files
    link = tmp_path / "linked"  # the hub cache's snapshots are links to blobs
    link.mkdir()
    for f in a.iterdir():
        (link / f.name).symlink_to(f)
    assert weights_identity(str(link), None) == got


def test_the_hand_written_files_are_safetensors(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    a = _model(tmp_path / "a")
    loaded = st.load_file(str(a / "model-00001-of-00002.safetensors"))
    assert loaded["model.layers.1.norm.weight"].tolist() == [1.0] * 8


def test_other_weights_are_another_model(tmp_path: Path) -> None:
    base = weights_identity(str(_model(tmp_path / "base")), None)

    def shape(h: dict[str, Any]) -> None:  # in the first shard only
        if "model.layers.1.q.weight" in h:
            h["model.layers.1.q.weight"]["shape"] = [8, 16]

    def offsets(h: dict[str, Any]) -> None:
        if "model.layers.1.q.weight" in h:
            h["model.layers.1.q.weight"]["data_offsets"][1] -= 2
            h["model.layers.1.norm.weight"]["data_offsets"][0] -= 2

    others = {
        "shape": _model(tmp_path / "shape", header_extra=shape),
        "offsets": _model(tmp_path / "offsets", header_extra=offsets),
        "fine-tune": _model(tmp_path / "tuned", seed=1),  # same header and size, other bytes
    }
    for why, d in others.items():
        assert weights_identity(str(d), None) != base, why
    shard = tmp_path / "base" / "model-00002-of-00002.safetensors"
    shard.rename(shard.with_name("model-00002-of-00003.safetensors"))  # another shard name
    assert weights_identity(str(tmp_path / "base"), None) != base


def test_weights_that_differ_in_one_byte_inside_a_tensor_are_another_model(
    tmp_path: Path,
) -> None:
    """Equal headers and sizes, equal first and last 64 KiB and middle 4 KiB of every tensor:
    one byte a quarter into one tensor tells them."""
    big = np.random.default_rng(3).standard_normal((512, 256)).astype(np.float32)  # 512 KiB
    tensors = {"model.layers.0.q.weight": big, "model.layers.0.k.weight": big * 2}
    for name in ("base", "edited"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"num_hidden_layers": 1}')
        _safetensors(tmp_path / name / "model.safetensors", tensors)
    edited = tmp_path / "edited" / "model.safetensors"
    raw = bytearray(edited.read_bytes())
    header = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[header + big.nbytes + big.nbytes // 4] ^= 0x01  # the second tensor, a quarter in
    edited.write_bytes(bytes(raw))
    assert weights_identity(str(tmp_path / "edited"), None) != weights_identity(
        str(tmp_path / "base"), None
    )


@pytest.mark.parametrize(
    "content, said",
    [
        (b"\x01\x02", "too short for a safetensors header"),
        (struct.pack("<Q", 101 * 2**20) + b"{}", "over the 104857600-byte limit"),
        (struct.pack("<Q", 64) + b'{"a": 1}', "ends inside its 64-byte header"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not JSON"),
        (struct.pack("<Q", 200_000) + b"[" * 200_000, "not JSON"),  # nested past recursion
        (struct.pack("<Q", len(SHORT)) + SHORT + b"\x00" * 4, r"tensor 't' at \[0, 8\]"),
    ],
)
def test_a_damaged_safetensors_file_is_a_config_error_naming_it(
    tmp_path: Path, content: bytes, said: str
) -> None:
    d = _model(tmp_path / "m")
    bad = d / "model-00002-of-00002.safetensors"
    bad.write_bytes(content)
    with pytest.raises(ConfigError, match=said) as got:
        weights_identity(str(d), None)
    assert str(bad) in str(got.value) and "re-download" in str(got.value)


def test_a_bin_checkpoint_is_known_by_its_bytes(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    weights = d / "pytorch_model.bin"
    weights.write_bytes(b"\x80\x02weights" * 1000)
    (d / "training_args.bin").write_bytes(b"not the model")
    first = weights_identity(str(d), None)
    assert first.startswith("weights:")
    (d / "training_args.bin").write_bytes(b"other training")  # not weights: vLLM skips it
    assert weights_identity(str(d), None) == first
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    assert weights_identity(str(copy), None) == first
    raw = bytearray(weights.read_bytes())
    raw[4000] ^= 1  # one byte, same size; another mtime, so not the cached hash
    weights.write_bytes(bytes(raw))
    os.utime(weights, ns=(1, 10**18))
    assert weights_identity(str(d), None) != first


def test_a_bin_rewritten_in_place_with_its_mtime_set_back_is_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same inode, size and mtime; the ctime tells the rewrite (a digest is kept by both, and
    only once the file's timestamps are past the filesystem's granularity: the clock is moved
    past it here rather than waited for)."""
    from stratastore.adapters import weights_digest

    real = weights_digest._now_ns
    monkeypatch.setattr(weights_digest, "_now_ns", lambda: real() + 10 * weights_digest.SETTLE_NS)
    d = tmp_path / "m"
    d.mkdir()
    weights = d / "pytorch_model.bin"
    weights.write_bytes(b"\x80\x02weights" * 1000)
    before = os.stat(weights)
    first = weights_identity(str(d), None)
    assert weights_identity(str(d), None) == first
    with open(weights, "r+b") as f:
        f.seek(4000)
        f.write(b"W")
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    while os.stat(weights).st_ctime_ns == before.st_ctime_ns:  # at most one clock step
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights_identity(str(d), None) != first


def test_one_weight_file_given_as_the_model_is_known_by_its_bytes(tmp_path: Path) -> None:
    model = tmp_path / "a" / "tiny.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    first = weights_identity(str(model), None)
    assert first.startswith("weights:")
    moved = tmp_path / "elsewhere" / "tiny.gguf"
    moved.parent.mkdir()
    shutil.copy(model, moved)
    assert weights_identity(str(moved), None) == first  # its bytes, not where it lies
    model.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 40)
    os.utime(model, ns=(1, 10**18))
    assert weights_identity(str(model), None) != first


def test_a_name_without_local_files_is_known_by_name(tmp_path: Path) -> None:
    assert weights_identity("no-such-org/no-such-model", "v2") == "no-such-org/no-such-model@v2"
    assert weights_identity(str(tmp_path / "missing"), None) == f"{tmp_path / 'missing'}@"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert weights_identity(str(empty), "r") == f"{empty}@r"
