"""A CPU host pool with the page methods of SGLang 0.5.23's MHA ``HostKVCache``
(``sglang/srt/mem_cache/pool_host/mha.py``: ``kv_buffer`` of ``[2, layers, tokens, heads,
head_dim]`` for ``layer_first`` and ``[2, tokens, layers, heads, head_dim]`` for
``page_first``; ``get_data_page``, ``get_dummy_flat_data_page``, ``set_from_flat_data_page``,
``get_size_per_token`` as it defines them), for driving storage backends as
``HiCacheController`` drives them.

SGLang's own class is not used because it cannot be imported here: ``sglang.srt.mem_cache
.memory_pool_host`` imports ``pool_host/group.py``, which imports ``mem_cache/memory_pool.py``,
which imports ``sglang.srt.configs``, whose ``nano_nemotron_vl.py`` imports
``multimodal/internvl_utils.py``, which imports ``torchvision``; the only ``torchvision`` for
torch 2.13 on the package index is built against the CUDA torch and fails to register its
operators against the CPU wheel (``RuntimeError: operator torchvision::nms does not exist``),
and SGLang 0.5.23 pins torch 2.14.1, of which this machine has no CPU wheel."""

from __future__ import annotations

from typing import Any

import torch


class CpuHostPool:
    """``size`` tokens of K/V in pages of ``page_size`` (see the module)."""

    def __init__(
        self,
        *,
        layout: str = "page_first",
        size: int = 1024,
        page_size: int = 64,
        layer_num: int = 4,
        head_num: int = 2,
        head_dim: int = 64,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        # dtype uint8: how SGLang keeps an fp8 K/V cache (every fp8 format alike)
        if layout not in ("layer_first", "page_first"):
            raise ValueError(f"layout {layout!r}")
        self.layout, self.size, self.page_size = layout, size, page_size
        self.layer_num, self.head_num, self.head_dim, self.dtype = (
            layer_num,
            head_num,
            head_dim,
            dtype,
        )
        self.device = "cpu"
        dims = (layer_num, size) if layout == "layer_first" else (size, layer_num)
        self.kv_buffer = torch.zeros((2, *dims, head_num, head_dim), dtype=dtype)

    def get_size_per_token(self) -> int:
        return int(2 * self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize)

    def _page(self, index: int) -> Any:
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index : index + self.page_size, :, :]
        return self.kv_buffer[:, index : index + self.page_size, :, :, :]

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page: torch.Tensor = self._page(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        shape = (2, self.layer_num, self.page_size, self.head_num, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self._page(index)
        page[...] = data_page.reshape(page.shape)

    def fill(self, index: int, seed: int) -> None:
        """Page ``index`` set to values drawn from ``seed`` (a page's content in the tests)."""
        g = torch.Generator().manual_seed(seed)
        page = self._page(index)
        if self.dtype == torch.uint8:
            page[...] = torch.randint(0, 256, page.shape, generator=g, dtype=torch.uint8)
        else:
            page[...] = torch.randn(page.shape, generator=g).to(self.dtype)
