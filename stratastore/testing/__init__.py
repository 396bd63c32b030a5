"""Conformance helpers shipped with the package, so other engines and other implementations
of the format can check themselves: the golden vectors (format-spec/vectors/), the
``strata conformance`` check of a directory, and the abstract ``StoreTests`` suite."""

from .conformance import CLAUSES, ConformanceReport, check_conformance
from .suite import StoreTests
from .vectors import load_manifest, load_vectors, vector_outcome

__all__ = [
    "CLAUSES",
    "ConformanceReport",
    "StoreTests",
    "check_conformance",
    "load_manifest",
    "load_vectors",
    "vector_outcome",
]
