"""The first-bad-page kernel (imported on first use by :func:`numba_kernels.cuda.kernels`; one
module per concern, see numba_kernels/_hash_kernel.py)."""

from numba import cuda


@cuda.jit  # type: ignore[misc]
def first_bad(actual, expected, result):  # type: ignore[no-untyped-def]
    """result[0] = the lowest page whose digest row differs (unchanged when none does). The
    rows may be 32 bytes or 8 little-endian words: the comparison is element by element."""
    i = cuda.grid(1)
    if i < actual.shape[0]:
        for w in range(actual.shape[1]):
            if actual[i, w] != expected[i, w]:
                cuda.atomic.min(result, 0, i)
                break
