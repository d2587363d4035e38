"""Export public architecture definitions (Hugging Face ``transformers``) to ONNX, for checks
on models this project did not write.

Models are built from their library configs with seeded random weights (no download); the
batch-norm statistics are re-estimated on random inputs, since with the default statistics
the activations of a deep random network underflow to denormals and every runtime slows.
Exported with ``torch.onnx.export(..., dynamo=False, opset_version=17)`` at batch 1.

    python scripts/export_public.py [--out-dir models/public] [--names resnet50 convnext_tiny ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _configs() -> dict:
    import transformers as hf

    return {
        # name: (model class, config, input shape)
        "hf_resnet50": (hf.ResNetForImageClassification, hf.ResNetConfig(), (1, 3, 224, 224)),
        "hf_resnet34": (hf.ResNetForImageClassification,
                        hf.ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[64, 128, 256, 512], layer_type="basic"),
                        (1, 3, 224, 224)),
        "hf_mobilenet_v2": (hf.MobileNetV2ForImageClassification, hf.MobileNetV2Config(), (1, 3, 224, 224)),
        "hf_regnet_y_400mf": (hf.RegNetForImageClassification,
                              hf.RegNetConfig(depths=[1, 3, 6, 6], hidden_sizes=[48, 104, 208, 440], groups_width=8,
                                              layer_type="y"), (1, 3, 224, 224)),
        "hf_convnext_tiny": (hf.ConvNextForImageClassification, hf.ConvNextConfig(), (1, 3, 224, 224)),
    }


def export(name: str, out_dir: Path, *, seed: int = 0) -> Path:
    """Build ``name`` with seeded weights, re-estimate its batch norms, export it; the path."""
    import torch

    configs = _configs()
    if name not in configs:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(configs)}")
    model_class, config, shape = configs[name]

    class Logits(torch.nn.Module):
        """The classifier with one tensor output (``transformers`` returns an output object)."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.inner(pixel_values=pixel_values).logits

    torch.manual_seed(seed)
    model = Logits(model_class(config))
    generator = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(4 if norms else 0):
            model(torch.randn(4, *shape[1:], generator=generator))
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.onnx"
    example = torch.randn(*shape, generator=generator)
    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["pixel_values"],
                      output_names=["logits"])
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path("models") / "public")
    parser.add_argument("--names", nargs="+", default=None, help="models (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = args.names or sorted(_configs())
    for name in names:
        started = time.perf_counter()
        path = export(name, args.out_dir, seed=args.seed)
        print(f"{name:20s} {path} ({path.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
