"""bfloat16 linear layers on oneDNN's prepacked weights: a bfloat16 model's CPU fast path.

On a CPU with bfloat16 instructions (AVX512-BF16, AMX), each `nn.Linear` weight is reordered
once, at load, into oneDNN's blocked layout, and every call runs oneDNN's linear on it
(`mkldnn._linear_pointwise`, the kernel inductor's freezing pass emits for a CPU linear),
instead of torch's plain bfloat16 `F.linear`, which converts or repacks its operands on
every call. The results are those of a bfloat16 matmul with float32 accumulation either
way, but not bit-identical to the plain path (another summation order). The dense weights
of the replaced layers are freed; a weight shared with another module (a tied output head)
stays where the other module holds it.
"""

from __future__ import annotations

import torch
from torch import nn


def can_pack(device: str, dtype: torch.dtype) -> bool:
    """Whether `pack_linears` applies: a bfloat16 model on a CPU whose oneDNN runs bfloat16."""
    return (
        device == "cpu"
        and dtype is torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class PackedLinear(nn.Module):
    """An `nn.Linear`'s forward on its weight in oneDNN's layout (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` in `model` by a `PackedLinear`; return how many."""
    parents = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name in parents:
        setattr(parent, name, PackedLinear(getattr(parent, name)))
    return len(parents)
