"""Which kernels and path the fused attention takes for CEM's extra query/key pair (eq. 12's diagonal).

A leaf module: :mod:`cemlib.kernels.dispatch`, :mod:`cemlib.kernels.ops`,
:mod:`cemlib.kernels.tied_attention_triton` and :mod:`cemlib.kernels.tied_attention_v2` all import
it, and it imports none of them (nor Triton), so the kernels package has no import cycle.
"""

from __future__ import annotations

__all__ = ["MAX_TILE_EXTRA", "V2_MAX_HEAD_DIM", "extra_path", "v2_covers"]

MAX_TILE_EXTRA = 128  # widest extra pair held in one register tile of the attention kernels
V2_MAX_HEAD_DIM = 128  # widest head the second version of the kernels takes


def extra_path(q_extra, extra_values: bool, extra_head_sum: bool = False) -> str | None:
    """How the Triton attention handles the extra query/key pair (CEM eq. 12's diagonal term):

    - ``None``: no extra pair;
    - ``"tile"``: in the kernels' register tiles, next to each head's queries and keys (an
      extra width up to :data:`MAX_TILE_EXTRA` runs efficiently; wider is correct but spills);
    - ``"logits"``: a head-shared pair (``q_extra`` of shape (B, L, D_e)) wider than that. Its
      logits ``scale q_extra k_extra^T`` are the same for every head, so they are one batched
      GEMM (B, L, L) that the kernels add tile by tile, and the head-summed extra values
      ``(sum_k P_k) k_extra`` another: O(B L^2) memory instead of the reference's O(B K L^2),
      and no per-head work at the extra width. It cannot return per-head extra values, so it
      is used without ``extra_values`` or with ``extra_head_sum``.
    """
    if q_extra is None:
        return None
    wide = q_extra.shape[-1] > MAX_TILE_EXTRA
    if wide and q_extra.dim() == 3 and (not extra_values or extra_head_sum):
        return "logits"
    return "tile"


def v2_covers(q, q_extra, extra_values: bool, extra_head_sum: bool = False) -> bool:
    """Whether the second version of the kernels (:mod:`cemlib.kernels.tied_attention_v2`)
    computes the call: head width (``q.shape[-1]``) at most :data:`V2_MAX_HEAD_DIM` (its
    autotune space is pruned for those widths), and no extra pair, or a head-shared one
    (``q_extra`` of shape (B, L, D_e), any width) without extra values or with head-summed ones
    (the default CEM layer), which it always takes on the shared-logits path. Per-head pairs,
    per-head extra values and wider heads are left to the first version
    (:mod:`cemlib.kernels.tied_attention_triton`)."""
    return q.shape[-1] <= V2_MAX_HEAD_DIM and (
        q_extra is None or (q_extra.dim() == 3 and (not extra_values or extra_head_sum)))
