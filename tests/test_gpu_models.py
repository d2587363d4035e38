"""Whole models built for a CUDA GPU: every kernel scheduled for the device.

The lowering checks run everywhere (no GPU or ``nvcc`` needed): a model lowered for the
H100 description has no kernel left as a host loop nest. The whole-model checks run only
where TVM sees a CUDA device: each model, built for the GPU found, matches ONNX Runtime on
the CPU.
"""

import numpy as np
import pytest
import torch
import tvm
from conftest import x86_description

import alt_tvm
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.gpu import SCHEDULED_ATTR, is_gpu, schedule_on_gpu
from alt_tvm.graph.lower import lower
from alt_tvm.graph.propagate import AltLayoutPass
from alt_tvm.options import BuildOptions
from alt_tvm.target import BOARDS, not_on_host

HAS_GPU = tvm.cuda(0).exist
H100 = BOARDS["h100"]


class SmallNet(torch.nn.Module):
    """A conv, a max pool, a global mean, a layer norm, a softmax and a matmul of two
    activations: a strategy kernel, kernels computed in their operands' layouts and kernels
    TVM legalizes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        tokens = y.flatten(2).transpose(1, 2)  # (1, 64, 16)
        tokens = self.norm(tokens)
        scores = torch.softmax(tokens @ tokens.transpose(1, 2), dim=-1)
        return self.fc(scores @ tokens).mean(dim=1)


def _lowered(target) -> tvm.IRModule:
    torch.manual_seed(0)
    imported = load_model(SmallNet().eval(), example_inputs=(torch.randn(1, 3, 16, 16),))
    return lower(imported.mod, AltLayoutPass(BuildOptions(target=target)))


def _kernels(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {g.name_hint: mod[g] for g in mod.get_global_vars() if isinstance(mod[g], tvm.tirx.PrimFunc)}


def test_every_kernel_of_a_model_lowered_for_a_gpu_runs_on_its_threads():
    kernels = _kernels(_lowered(H100))
    assert any(name.startswith("alt_conv2d") for name in kernels)  # the CUDA strategy took the conv
    assert any("max_pool" in name for name in kernels)
    for name, func in kernels.items():
        script = func.script()
        assert "threadIdx" in script and "blockIdx" in script, f"{name} is not bound to GPU threads"
        assert "T.parallel" not in script, f"{name} keeps a CPU parallel loop"
        assert func.attrs[SCHEDULED_ATTR], f"{name} is not marked scheduled: TVM's pipeline would schedule it again"


def test_the_same_model_lowered_for_a_cpu_keeps_its_cpu_loop_nests():
    kernels = _kernels(_lowered(x86_description("avx2")))
    assert not any("threadIdx" in f.script() for f in kernels.values())
    assert any("T.parallel" in f.script() for f in kernels.values())
    assert not any(f.attrs is not None and SCHEDULED_ATTR in f.attrs for f in kernels.values())


def test_gpu_rules_refuse_a_cpu_target_by_name():
    func = next(iter(_kernels(_lowered(x86_description("avx2"))).values()))
    cpu = x86_description("avx2").to_tvm()
    assert not is_gpu(cpu) and is_gpu(H100.to_tvm())
    with pytest.raises(ValueError, match="not a GPU"):
        schedule_on_gpu(func, cpu)


@pytest.mark.skipif(HAS_GPU, reason="checks the message where there is no GPU")
def test_cuda_code_says_why_it_cannot_run_without_a_gpu():
    assert "no CUDA device" in not_on_host(H100.tvm_target)


# The whole models the GPU benchmark times (benchmarks/bench_gpu_models.py), at batch 1.
GPU_MODELS = ("tv_resnet50", "tv_mobilenet_v2", "hf_bert_base", "tv_vit_b_16")


@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here (tvm.cuda(0).exist is False): runs on a GPU machine, "
                                        "see docs/gpu.md")
@pytest.mark.parametrize("name", GPU_MODELS)
def test_a_public_model_built_whole_for_the_gpu_matches_onnxruntime(name, tmp_path):
    from alt_tvm.bench.onnxruntime import onnxruntime_session
    from alt_tvm.models.public import example_input, export, public_models
    from alt_tvm.target import detect_cuda

    path = export(name, tmp_path)
    x = example_input(public_models()[name], seed=1).numpy()
    model = alt_tvm.build(str(path), target=detect_cuda())
    assert model.device.dlpack_device_type() == tvm.cuda(0).dlpack_device_type()
    out = model(x)[0]
    ref = onnxruntime_session(path, threads=4)(x)[0]
    assert not np.isnan(out).any()
    err = float(np.abs(out - ref).max() / np.abs(ref).max())
    assert err <= 1e-3, f"{name}: max error {err:.2e} of max|ref|"
