"""A CPU without native bf16 matmul, as far as this VM can play one (issue 30: the issue's machine is
AVX2): put this folder first on PYTHONPATH together with

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2

(torch's own kernels, oneDNN's and MKL's then use AVX2 code only) and torch's check for native bf16
(``torch.ops.mkldnn._is_mkldnn_bf16_supported``, which ``verify.search.screen_dtype`` asks) answers
False, so the search runs in fp32 as it would there. A benchmark shim (bench/smollm2/search_side_by_side.sh
``NO_NATIVE_BF16=1``), never imported by the tool. The clock, caches and memory stay this VM's."""

import torch


class _NoNativeBf16:
    def __init__(self, ops) -> None:
        self._ops = ops

    def __getattr__(self, name):
        if name == "_is_mkldnn_bf16_supported":
            return lambda: False
        return getattr(self._ops, name)


torch.ops.__dict__["mkldnn"] = _NoNativeBf16(torch.ops.mkldnn)
