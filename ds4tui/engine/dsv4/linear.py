"""Weight matrices of the DeepSeek V4 net: a dense tensor or a GGUF file's own blocks.

Owns `linear(x, w)` (x @ w^T) for the two kinds of weight the net is given:
- a torch tensor [out, in] (checkpoints from safetensors, dequantized at load);
- a `QuantMatrix` (a ds4 GGUF: the file's F16/Q8_0/Q2_K/IQ2_XXS/Q4_K blocks, left in the
  file mapping and read by the C kernels: GEMV for one row, block GEMM for more), or its
  `Q8Matrix` form (activations rounded to 8 bits, integer dot products, as ds4's CPU path);
and `ExpertBank`, one [E, rows, cols] routed-expert tensor of a GGUF, which hands out one
expert's rows as a `QuantMatrix` over the same memory (no copy): a token that selects 6 of
256 experts reads those 6 experts' bytes and no others. `grouped_linear` is the grouped
output projection (wo_a: head group g through rows g*rank..(g+1)*rank).
Leaves to weights.py / gguf.py: where the tensors come from.
"""

from __future__ import annotations

import torch

from ds4tui.engine.kernels.qdot import Q8Matrix
from ds4tui.engine.kernels.qgemv import QuantMatrix

Weight = torch.Tensor | QuantMatrix


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """x [..., in] -> [..., out] = x @ w^T, in x's dtype."""
    if isinstance(w, torch.Tensor):
        return x @ w.T
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    if flat.shape[0] == 1:
        y = w.matvec(flat[0]).view(1, w.rows)
    else:
        y = w.matmul(flat)
    return y.reshape(*lead, w.rows).to(x.dtype)


def row_slice(w: Weight, r0: int, r1: int) -> Weight:
    """Rows r0..r1-1 of w (a view: blocks never span rows)."""
    if isinstance(w, torch.Tensor):
        return w[r0:r1]
    if len(w.parts) != 1:
        raise ValueError("row_slice of a multi-part matrix")
    qtype, blocks = w.parts[0]
    return type(w).from_parts([(qtype, blocks[r0:r1])], w.cols)  # a Q8Matrix stays one


def grouped_linear(x: torch.Tensor, w: Weight, groups: int) -> torch.Tensor:
    """x [n, G, in] -> [n, G * rank]: group g through w's rows g*rank..(g+1)*rank ([G*rank, in])."""
    if isinstance(w, torch.Tensor):
        rank = w.shape[0] // groups
        return torch.einsum("ngi,gri->ngr", x, w.reshape(groups, rank, w.shape[1])).reshape(x.shape[0], -1)
    rank = w.rows // groups
    return torch.cat([linear(x[:, g], row_slice(w, g * rank, (g + 1) * rank)) for g in range(groups)], dim=-1)


def dense(w: Weight) -> torch.Tensor:
    """The float32 values of w (tests; dequantizes a block matrix)."""
    return w.float() if isinstance(w, torch.Tensor) else w.dequantize()


class ExpertBank:
    """E experts' [rows, cols] matrices stored as one block tensor [E * rows, row_bytes]
    (GGUF keeps each layer's routed gate, up and down as one 3-D tensor each). `bank[e]` is
    expert e's QuantMatrix, made on first use and kept (a view, never a copy); with act_q8 a
    Q8Matrix (activations rounded to Q8_K, integer dot products: ds4's CPU path)."""

    def __init__(self, qtype: str, blocks: torch.Tensor, n_experts: int, rows: int, cols: int,
                 act_q8: bool = False) -> None:
        if blocks.shape[0] != n_experts * rows:
            raise ValueError(f"{blocks.shape[0]} block rows for {n_experts} experts of {rows} rows")
        self.qtype, self.blocks, self.n_experts, self.rows, self.cols = qtype, blocks, n_experts, rows, cols
        self.act_q8 = act_q8
        self._mats: dict[int, QuantMatrix] = {}

    def __len__(self) -> int:
        return self.n_experts

    def __getitem__(self, e: int) -> QuantMatrix:
        m = self._mats.get(e)
        if m is None:
            if not 0 <= e < self.n_experts:
                raise IndexError(f"expert {e} outside 0..{self.n_experts - 1}")
            m = QuantMatrix(self.blocks[e * self.rows:(e + 1) * self.rows], self.qtype, self.cols)
            self._mats[e] = m = Q8Matrix.of(m) if self.act_q8 else m
        return m

    @property
    def expert_bytes(self) -> int:
        return self.blocks.shape[1] * self.rows

    def dequantize(self) -> torch.Tensor:
        """[E, rows, cols] float32 (tests)."""
        return torch.stack([self[e].dequantize() for e in range(self.n_experts)])
