"""Page-level kernels: BLAKE3 page hashing and validated (ladder) copies.

This release ships the CPU paths (the ``blake3`` package, multi-threaded); the numba CUDA
kernels and ``device="auto"`` dispatch arrive with the restore work (issue 5) and are tested
bit-exact against these.
"""

from .cpu import DIGEST_BYTES, hash_page, page_hashes, start_page_hashes, validated_copy

__all__ = [
    "DIGEST_BYTES",
    "hash_page",
    "page_hashes",
    "start_page_hashes",
    "validated_copy",
]
