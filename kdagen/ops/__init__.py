"""Public ops with flash-linear-attention's signatures."""
from .family import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, fused_recurrent_delta_rule,
                     fused_recurrent_gated_delta_rule, fused_recurrent_gla)
from .dplr import chunk_dplr_delta_rule, fused_recurrent_dplr_delta_rule
from .member import chunk_member, fused_recurrent_member

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_delta_rule",
           "fused_recurrent_delta_rule", "chunk_gla", "fused_recurrent_gla", "chunk_dplr_delta_rule",
           "fused_recurrent_dplr_delta_rule", "chunk_member", "fused_recurrent_member"]
