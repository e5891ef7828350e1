"""kdagen: a compiler-style kernel generator and autotuner for Kimi Delta Attention and the
diagonal-plus-rank-1 family of linear-attention recurrences."""
from .kernels import warn_if_untested as _warn_if_untested
from .ops import library as _library  # noqa: F401 - registers the ops with torch.library (torch.compile)
from .ops.chunk import chunk_kda
from .ops.cp import CPContext, build_cp_context
from .ops.dplr import chunk_dplr_delta_rule, fused_recurrent_dplr_delta_rule
from .ops.family import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, fused_recurrent_delta_rule,
                         fused_recurrent_gated_delta_rule, fused_recurrent_gla)
from .ops.recurrent import fused_recurrent_kda
from .spec.load import load_spec
from .spec.validate import check_lowerable
from .version import __version__

_warn_if_untested()  # one warning, here at import, for a Triton outside the tested range

__all__ = ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
           "chunk_delta_rule", "fused_recurrent_delta_rule", "chunk_gla", "fused_recurrent_gla", "chunk_dplr_delta_rule",
           "fused_recurrent_dplr_delta_rule", "build_cp_context", "CPContext", "check_lowerable", "load_spec", "__version__"]
