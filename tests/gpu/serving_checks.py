"""The serving proofs as pytest tests, on the GPU machine (they skip elsewhere; not named test_*.py, so the
CPU suite does not collect them -- name the file):

    PYTHONPATH=. python -m pytest -q -p no:cacheprovider tests/gpu/serving_checks.py

Each runs one section of ``tests/gpu/serving.py`` and fails on any FAIL line it prints."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving  # noqa: E402

pytestmark = pytest.mark.skipif(not serving.GPU, reason="needs a GPU (and TRITON_INTERPRET unset)")


def _run(section, name_contains=""):
    serving.OUT["claims"].clear()
    section()
    claims = [c for c in serving.OUT["claims"] if name_contains in c["name"]]
    assert claims, "the section made no claim"
    bad = [f"{c['name']}: {c['detail']}" for c in claims if c["result"] == "FAIL"]
    assert not bad, "\n".join(bad)


def test_decode_calls_never_synchronise():
    _run(serving.sync_free, "fused_recurrent_kda")


def test_packed_decode_captures_and_replays_in_a_cuda_graph():
    _run(serving.graph_replay)


def test_decode_gives_the_recurrence_for_any_gate_in_bf16():
    _run(serving.gates, "decode")


def test_chunk_kda_gives_the_recurrence_for_any_gate_in_bf16():
    _run(serving.gates, "chunk_kda")


def test_chunk_kda_training_gives_the_recurrence_for_any_gate_in_bf16():
    _run(serving.gates, "chunk_kda training")


def test_chunk_kda_never_synchronises_given_host_lengths():
    _run(serving.sync_free, "chunk_kda")


def test_chunk_kda_never_synchronises_with_device_offsets():
    _run(serving.sync_free, "offsets on the device only")


def test_packed_prefill_captures_and_replays_with_new_lengths():
    _run(serving.prefill_graph)


def test_the_device_built_packed_schedule_gives_the_host_ones_answer():
    _run(serving.prefill_graph, "device-built schedule")


def test_the_lean_body_gives_the_recurrence_for_items_of_any_length_in_bf16():
    _run(serving.lean_items)
