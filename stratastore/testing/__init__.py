"""Conformance helpers shipped with the package, so other engines and other implementations
of the format can check themselves: the golden vectors (format-spec/vectors/), the
``strata conformance`` check of a directory, the abstract ``StoreTests`` suite, and
``BackendTests``, the suite every segment backend (a level) passes."""

from stratastore.testing.backend_suite import BackendTests
from stratastore.testing.conformance import CLAUSES, ConformanceReport, check_conformance
from stratastore.testing.suite import StoreTests
from stratastore.testing.vectors import load_manifest, load_vectors, vector_outcome

__all__ = [
    "BackendTests",
    "CLAUSES",
    "ConformanceReport",
    "StoreTests",
    "check_conformance",
    "load_manifest",
    "load_vectors",
    "vector_outcome",
]
