"""kdagen: a compiler-style kernel generator and autotuner for Kimi Delta Attention and the
diagonal-plus-rank-1 family of linear-attention recurrences."""
__version__ = "0.1.0"

from .ops.chunk import chunk_kda  # noqa: E402
from .ops.recurrent import fused_recurrent_kda  # noqa: E402

__all__ = ["chunk_kda", "fused_recurrent_kda", "__version__"]
