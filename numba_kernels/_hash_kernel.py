"""The page-hash kernel: one CUDA block per page, BLAKE3 root chaining values (the algorithm:
numba_kernels/cuda.py). Imported on first use by :func:`numba_kernels.cuda.kernels`; kernels live
at module level, one module per concern (hash, validate, copy), because the numba CUDA simulator
swaps a kernel module's global ``cuda`` for its fake while a kernel of it runs.
"""

from numba import cuda, uint32

from .cuda import MAX_RUN, MAX_THREADS, build

parts = build(cuda.jit(device=True))
chunk_cv, parent_cv = parts["chunk_cv"], parts["parent_cv"]
imin, imax = parts["imin"], parts["imax"]  # not min/max: see cuda._imin


@cuda.jit  # type: ignore[misc]
def page_hash(data, total, page_bytes, iv, sched, gidx, out):  # type: ignore[no-untyped-def]
    """One block per page: out[page, 0:8] = the page's BLAKE3 root chaining value."""
    page = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    start = page * page_bytes
    plen = imin(page_bytes, total - start)
    chunks = imax(1, (plen + 1023) // 1024)
    run = 1
    while run * nthreads < chunks:
        run *= 2
    runs = (chunks + run - 1) // run
    cvs = cuda.shared.array((MAX_THREADS, 8), uint32)
    st = cuda.local.array(16, uint32)
    m = cuda.local.array(16, uint32)
    local = cuda.local.array((MAX_RUN, 8), uint32)
    tmp = cuda.local.array(8, uint32)
    if tid < runs:  # this thread's run: a whole subtree of `run` chunks (the last: fewer)
        first = tid * run
        cnt = imin(run, chunks - first)
        for j in range(cnt):
            c = first + j
            n = imin(1024, plen - 1024 * c)
            chunk_cv(data, start + 1024 * c, n, c, chunks == 1, iv, sched, gidx, st, m, local[j])
        while cnt > 1:
            half = cnt // 2
            for j in range(half):
                parent_cv(
                    local[2 * j],
                    local[2 * j + 1],
                    runs == 1 and cnt == 2,
                    iv,
                    sched,
                    gidx,
                    st,
                    m,
                    tmp,
                )
                for w in range(8):
                    local[j, w] = tmp[w]
            if cnt % 2:
                for w in range(8):
                    local[half, w] = local[cnt - 1, w]
            cnt = (cnt + 1) // 2
        for w in range(8):
            cvs[tid, w] = local[0, w]
    cuda.syncthreads()
    cnt = runs
    while cnt > 1:  # the shared-memory tree over the runs
        half = cnt // 2
        if tid < half:
            parent_cv(cvs[2 * tid], cvs[2 * tid + 1], cnt == 2, iv, sched, gidx, st, m, tmp)
        elif tid == half and cnt % 2:
            for w in range(8):
                tmp[w] = cvs[cnt - 1, w]
        cuda.syncthreads()
        if tid < half or (tid == half and cnt % 2):
            for w in range(8):
                cvs[tid, w] = tmp[w]
        cuda.syncthreads()
        cnt = (cnt + 1) // 2
    if tid == 0:
        for w in range(8):
            out[page, w] = cvs[0, w]
