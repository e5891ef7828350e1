"""The tuning stage: the generic, resumable Optuna engine (:mod:`.engine`) searching the
declarative spaces (:mod:`.space`) of each kernel family (:mod:`.families`); compile-only
checks in worker processes (:mod:`.compile_pool`); candidates built, checked against float64
and timed on a GPU (:mod:`.candidates`), in an isolated worker (:mod:`.isolation`); and the
driver that ``kdagen build`` runs (:mod:`.driver`)."""
