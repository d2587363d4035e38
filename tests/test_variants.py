"""Copies of one model built in worker processes at once (the in-model stage's builds): the
same kernels and the same numbers as copies built in this process, from a model file or a
serialised module, and a copy whose worker fails is built here instead."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import torch_to_onnx
from test_in_model import INPUTS, MODEL

from alt_tvm.deploy.artifact import LoadedModel
from alt_tvm.graph.compiled import CompiledModel
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.variants import VariantBuilder
from alt_tvm.in_model import Choice, choices_log
from alt_tvm.options import build_options
from alt_tvm.records import target_key
from alt_tvm.target import host

OPTIONS = build_options(None, caller="test")
TARGET = target_key(host().to_tvm())


def logs(mod):
    """The untuned copy, and a copy with the second convolution switched to SConv."""
    with VariantBuilder(mod, OPTIONS, workers=1) as here:
        (plain,) = here.build([choices_log("plain", TARGET, {})])
    keys = [k.workload for k in plain.kernels if k.kind == "partition"]
    assert len(keys) == 2
    switched = {keys[1]: Choice("sconv", None, "sconv")}
    return [choices_log("plain", TARGET, {}), choices_log("switched", TARGET, switched)]


def summary(kernels):
    return sorted((k.name, k.kind, k.workload) for k in kernels)


def check_against_here(mod, built, copy_logs):
    with VariantBuilder(mod, OPTIONS, workers=1) as here:
        expected = here.build(copy_logs)
    reference = MODEL(*INPUTS).detach().numpy()
    for copy, same in zip(built, expected):
        assert isinstance(same.model, CompiledModel)
        assert summary(copy.kernels) == summary(same.kernels)
        np.testing.assert_allclose(copy.model(INPUTS[0].numpy())[0], reference, rtol=1e-4, atol=1e-4)
    # the two copies differ where their logs do
    assert summary(expected[0].kernels) != summary(expected[1].kernels)


def test_copies_built_in_workers_from_a_serialised_module_match_copies_built_here():
    mod = load_model(MODEL, example_inputs=INPUTS).mod
    copy_logs = logs(mod)
    with VariantBuilder(mod, OPTIONS, workers=2) as builder:
        built = builder.build(copy_logs)
        assert all(isinstance(copy.model, LoadedModel) for copy in built)
        check_against_here(mod, built, copy_logs)


def test_copies_built_in_workers_from_the_model_file_match_copies_built_here(tmp_path):
    path = tmp_path / "pair.onnx"
    torch_to_onnx(MODEL, INPUTS, path, dynamo=False)
    mod = load_model(path).mod
    copy_logs = logs(mod)
    with VariantBuilder(mod, OPTIONS, source=path, workers=2) as builder:
        built = builder.build(copy_logs)
        assert all(isinstance(copy.model, LoadedModel) for copy in built)
        check_against_here(mod, built, copy_logs)


def test_a_copy_whose_worker_fails_is_built_here(tmp_path, caplog):
    mod = load_model(MODEL, example_inputs=INPUTS).mod
    copy_logs = logs(mod)
    # the workers cannot import the model (no such file); this process has it
    with VariantBuilder(mod, OPTIONS, source=tmp_path / "missing.onnx", workers=2) as builder:
        built = builder.build(copy_logs)
    assert all(isinstance(copy.model, CompiledModel) for copy in built)
    assert caplog.text.count("building it in this process") == 2


def test_bad_worker_counts_are_clear_errors():
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        VariantBuilder(None, OPTIONS, workers=0)
    with pytest.raises(ValueError, match="build_workers"):
        from alt_tvm.options import InModelConfig

        InModelConfig(build_workers=True)


def test_a_copy_is_built_without_argument_checks_and_a_build_keeps_them():
    import alt_tvm

    mod = load_model(MODEL, example_inputs=INPUTS).mod
    with VariantBuilder(mod, OPTIONS, workers=1) as here:
        (copy,) = here.build([choices_log("plain", TARGET, {})])
    normal = alt_tvm.build(mod, OPTIONS)

    def checks(model):
        return sum(lib.inspect_source("ll").count("assert_fail") for lib in model.executable.mod.imports)

    assert checks(normal) > 10  # every kernel checks each argument's shape and type
    assert checks(copy.model) == 0
    np.testing.assert_allclose(copy.model(INPUTS[0].numpy())[0], MODEL(*INPUTS).detach().numpy(),
                               rtol=1e-4, atol=1e-4)
