"""Conformance helpers shipped with the package, so other engines and other implementations
of the format can check themselves against the golden vectors (format-spec/vectors/)."""

from .vectors import load_manifest, vector_outcome

__all__ = ["load_manifest", "vector_outcome"]
