"""atheris runner: ``python fuzz/run.py TARGET [libFuzzer args] [corpus dir]``.

Example: ``python fuzz/run.py sidecar -runs=100000 fuzz/corpus/sidecar``. Targets are in
fuzz/targets.py; the committed corpus was seeded from format-spec/vectors/v1.
"""

from __future__ import annotations

import os
import sys

import atheris
import blake3  # noqa: F401  (imported first so only stratastore's code is instrumented)
import lmdb  # noqa: F401
import numpy  # noqa: F401
import zstandard  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports():
    from fuzz.targets import TARGETS, run_one


def main() -> None:
    target = sys.argv[1]
    if target not in TARGETS:
        raise SystemExit(f"unknown target {target!r}; one of {', '.join(TARGETS)}")
    atheris.Setup([sys.argv[0], *sys.argv[2:]], lambda data: run_one(target, data))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
