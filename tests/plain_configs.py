"""The plain kernels the tests pin where they name a config.  The config dataclasses' defaults are the
heuristic's for bf16 KDA at K=V=128 (split output, loads ahead, the split intra backward, tf32 dots, the
loaded readout), so a test that means these kernels names them: each ``plain_*`` builds its family's config
from these fields and the ones it is given.  No import of conftest here (the sm_90 compile workers import this
module, and conftest sets the interpreter flag)."""
from __future__ import annotations

from kdagen.config import ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, RecurrentConfig

PLAIN_FWD = dict(solve_load_ahead=0)  # the solve's loads where each is first read
# the training forward: O formed in the state pass (no output launch), each row-block's loads where first read,
# exact fp32 dots in the inverse, the diagonal in the input dtype, 64-wide tiles, two stages
PLAIN_TRAIN = dict(intra_block_k=64, state_block_v=64, state_num_stages=2, inverse_precision="ieee",
                   diag_precision="input", intra_load_ahead=False, split_output=False, out_block_v=64)
# the backward: the intra gradients in one launch, no load ahead in the reverse pass, exact fp32 dots, the
# diagonal in the input dtype, [64, 32] dqkw tiles, 32-wide intra V tiles, 4 warps, two stages
PLAIN_BWD = dict(state_num_stages=2, dqkw_block_k=64, dqkw_block_v=32, intra_block_v=32, intra_num_warps=4,
                 inverse_precision="ieee", intra_split=False, diag_precision="input", rerun_num_warps=4,
                 state_prefetch=False)
PLAIN_DECODE = dict(block_v=32, num_warps=4, readout="updated")  # o read after the update


def plain_fwd(**kw):
    return ChunkFwdConfig(**{**PLAIN_FWD, **kw})


def plain_train(**kw):
    return ChunkTrainConfig(**{**PLAIN_TRAIN, **kw})


def plain_bwd(**kw):
    return ChunkBwdConfig(**{**PLAIN_BWD, **kw})


def plain_decode(**kw):
    return RecurrentConfig(**{**PLAIN_DECODE, **kw})
