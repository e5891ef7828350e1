"""Public ops with flash-linear-attention's signatures."""
from .dplr import fused_recurrent_dplr_delta_rule
from .family import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, fused_recurrent_delta_rule,
                     fused_recurrent_gated_delta_rule, fused_recurrent_gla)
from .member import chunk_member, fused_recurrent_member

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_delta_rule",
           "fused_recurrent_delta_rule", "chunk_gla", "fused_recurrent_gla",
           "fused_recurrent_dplr_delta_rule", "chunk_member", "fused_recurrent_member"]
