"""The kernels a build emits for public models are those recorded in
``tests/data/public_kernels.json`` (:mod:`kernel_digests`): a change of the code's shape
(modules moved, options objects, fusion patterns declared by the strategies) must leave the
generated code as it was. The target is pinned, so the digests hold on every machine.

A change that means to alter kernels regenerates the table on purpose:
``python tests/kernel_digests.py --models <exports> --isa avx512 --out tests/data/public_kernels.json``
(after removing the entries it changes), and says so in its commit.

Fast: two models through the TorchScript exporter, on both ISAs where recorded. Slow: every
recorded public model and exporter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernel_digests import kernel_digests

TABLE = json.loads((Path(__file__).parent / "data" / "public_kernels.json").read_text())
FAST = ("hf_bert_tiny", "hf_mobilenet_v2")


def _cases(fast: bool) -> list[tuple[str, str, str]]:
    cases = []
    for key in sorted(TABLE):
        file, isa = key.rsplit(":", 1)
        name, exporter = (file[:-len(".dynamo.onnx")], "dynamo") if file.endswith(".dynamo.onnx") \
            else (file[:-len(".onnx")], "torchscript")
        if (name in FAST and exporter == "torchscript") == fast:
            cases.append((name, exporter, isa))
    return cases


def _export(name: str, exporter: str, folder: Path) -> Path:
    pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    from alt_tvm.models import public

    if name.startswith(("tv_", "timm_")):
        public._python_torchvision()
        pytest.importorskip("torchvision.models")
        if name.startswith("timm_"):
            pytest.importorskip("timm")
    return public.export(name, folder, exporter=exporter)


def _check(name: str, exporter: str, isa: str, folder: Path) -> None:
    path = _export(name, exporter, folder)
    want = TABLE[f"{path.name}:{isa}"]
    if isinstance(want, str):
        pytest.skip(f"no digests recorded for {path.name} on {isa}: {want}")
    got = kernel_digests(path, isa=isa)
    assert len(got) == len(want), f"{path.name} on {isa}: {len(got)} kernels, {len(want)} recorded"
    changed = sorted(set(got) ^ set(want))
    assert got == want, f"{path.name} on {isa}: {len(changed)} kernel digests differ from the recorded ones"


def test_the_table_covers_both_isas_and_the_fast_models():
    isas = {key.rsplit(":", 1)[1] for key in TABLE}
    assert isas == {"avx2", "avx512"}
    assert {name for name, _, _ in _cases(fast=True)} == set(FAST)
    assert all(isinstance(v, list) and v for v in TABLE.values() if not isinstance(v, str))


@pytest.mark.parametrize("name,exporter,isa", _cases(fast=True))
def test_public_model_kernels_are_unchanged(name, exporter, isa, tmp_path):
    _check(name, exporter, isa, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name,exporter,isa", _cases(fast=False))
def test_every_public_model_kernels_are_unchanged(name, exporter, isa, tmp_path):
    _check(name, exporter, isa, tmp_path)
