"""The codegen stage: lowering a spec to a :class:`~.lower.Plan` (:mod:`.lower`, with the gate
printed to Triton by :mod:`.triton_printer`), then rendering the plan and a config into
Triton source through the Jinja templates (:mod:`.render`)."""
