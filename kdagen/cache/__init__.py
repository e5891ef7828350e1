"""The cache stage: tuned winners stored per GPU (:mod:`.store`) under exact keys
(:mod:`.keys`), the GPU profiles they are tuned for (:mod:`.gpus`), and what an op call runs
(:mod:`.lookup`: the caller's config, a stored winner, or a heuristic from :mod:`.heuristics`).
:mod:`.paths` says where kdagen writes."""
