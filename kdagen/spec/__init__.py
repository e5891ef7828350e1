"""The spec stage: a recurrence of the DPLR family in sympy (:mod:`.recurrence`), written in
the symbols of :mod:`.symbols`, with a gate from :mod:`.gates`; its chunkwise structure and
safe sub-tile length (:mod:`.structure`); the float64 references every kernel is tested
against (:mod:`.reference`) and their self-checks (:mod:`.verify`)."""
from .gates import GATES, Gate, gate_custom, gate_direct, gate_lower_bound, gate_softplus
from .recurrence import DECAY_KINDS, MEMBERS, Input, Recurrence, deltanet, dplr, gdn, get_spec, gla, kda
from .symbols import A_log, Sigmoid, Softplus, a_free, b_free, beta, dt_bias, g, g_min, k, q, z

__all__ = ["GATES", "Gate", "gate_custom", "gate_direct", "gate_lower_bound", "gate_softplus", "DECAY_KINDS",
           "MEMBERS", "Input", "Recurrence", "deltanet", "dplr", "gdn", "get_spec", "gla", "kda", "A_log",
           "Sigmoid", "Softplus", "a_free", "b_free", "beta", "dt_bias", "g", "g_min", "k", "q", "z"]
