"""scripts/conv_share_of_peak.py: which kernels count as dense 1x1/3x3 convs, and their FLOPs."""

import pytest
import torch
from conftest import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("conv_share_of_peak")


def test_only_dense_1x1_and_3x3_convs_are_counted(script):
    import alt_tvm

    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),  # dense 3x3: counted
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise: bound by memory
        torch.nn.Conv2d(16, 32, 1),  # dense 1x1: counted
        torch.nn.Conv2d(32, 32, 5, padding=2),  # dense 5x5: not a 1x1 or 3x3
    ).eval()
    x = torch.rand(1, 8, 14, 14)
    built = alt_tvm.build(model, example_inputs=(x,),
                          strategy_options={"alt": {"fuse_blocks": False}})
    convs = script.dense_convs(built.report.kernels)
    assert sorted((c["window"], c["in"], c["out"]) for c in convs.values()) == [("1x1", 16, 32), ("3x3", 8, 16)]
    flops = {c["window"]: c["flops"] for c in convs.values()}
    assert flops == {"3x3": 2 * 14 * 14 * 16 * 8 * 9, "1x1": 2 * 14 * 14 * 32 * 16}
    # the 1x1: 200704 FLOPs over (16*14*14 + 32*16 + 32*14*14) * 4 bytes read or written at least
    assert {c["window"]: round(c["intensity"], 2) for c in convs.values()}["1x1"] == round(200704 / 39680, 2)
