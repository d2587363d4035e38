"""Public architecture definitions, built offline with seeded weights, and their ONNX export.

The definitions come from packages that ship them: Hugging Face ``transformers`` (built from
their library configs, which are the published sizes; no download), PyTorch's own
``nn.TransformerEncoder``, ``torchvision`` and ``timm`` (``pip install --no-deps timm
torchvision==0.28.0``: their Python model code, built offline). Weights are seeded random;
batch-norm statistics are re-estimated on random inputs, since with the default statistics the
activations of a deep random network underflow to denormals and every runtime slows. Each
model is exported by either of PyTorch's exporters:

* ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=17)``;
* ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` (the default since PyTorch 2.9; needs
  ``onnxscript``).

:data:`GROUPS` names sets of models (``cnn_suite``: the torchvision CNN suite). Where no
torchvision wheel matches the installed torch, :func:`use_torchvision_source` loads its
pure-Python model definitions from an unpacked wheel's ``torchvision`` folder. The export
command is ``scripts/export_public.py``; the sweep over these models is
``benchmarks/sweep_public.py``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXPORTERS", "GROUPS", "KINDS", "PublicModel", "example_input", "export", "instantiate",
           "public_models", "select", "select_or_exit", "use_torchvision_source"]

EXPORTERS = ("torchscript", "dynamo")
KINDS = ("cnn", "transformer")


@dataclass(frozen=True)
class PublicModel:
    """A public architecture, ready to export.

    Attributes
    ----------
    name : str
        Short name (``hf_`` for ``transformers``, ``tv_`` for ``torchvision``, ``timm_`` for
        ``timm``, ``torch_`` for ``torch.nn``).
    kind : str
        ``"cnn"`` or ``"transformer"``.
    make : callable
        Builds the module (``() -> torch.nn.Module`` with one tensor output), seeded by the caller.
    input_shape : tuple of int
        Shape of the one input.
    input_dtype : str
        ``"float32"`` (images, embeddings) or ``"int64"`` (token ids).
    """

    name: str
    kind: str
    make: Callable[[], object]
    input_shape: tuple[int, ...]
    input_dtype: str = "float32"

    @property
    def input_name(self) -> str:
        return "input_ids" if self.input_dtype == "int64" else "pixel_values"


def _hf(model_class_name: str, config_name: str, *, argument: str, output: str, **config) -> Callable[[], object]:
    """A ``transformers`` model called with one keyword ``argument``, returning its ``output``
    field (``transformers`` returns an output object; the exporters want a tensor)."""

    def make():
        import torch
        import transformers as hf

        inner = getattr(hf, model_class_name)(getattr(hf, config_name)(**config))

        class OneTensor(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return getattr(self.inner(**{argument: x}), output)

        return OneTensor()

    return make


def _hf_vision(model_class_name: str, config_name: str, output: str = "logits", **config) -> Callable[[], object]:
    return _hf(model_class_name, config_name, argument="pixel_values", output=output, **config)


def _hf_text(model_class_name: str, config_name: str, **config) -> Callable[[], object]:
    """The encoder's last hidden state for a batch of token ids (no padding mask)."""
    return _hf(model_class_name, config_name, argument="input_ids", output="last_hidden_state", **config)


def _torch_encoder() -> object:
    import torch

    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)  # post-norm
    return torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def _python_torchvision() -> None:
    """Let ``import torchvision`` load its Python code beside a torch its compiled ops were not
    built for: its meta registrations (of those ops, which no model here uses) are skipped."""
    import types

    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


# transformers imports torchvision where it is installed: before any model is built.
_python_torchvision()


def _torchvision(name: str, **kwargs) -> Callable[[], object]:
    """``torchvision.models.<name>(**kwargs)``: no pretrained weights (``weights=None``, the
    default of every builder)."""

    def make():
        import importlib

        _python_torchvision()
        return getattr(importlib.import_module("torchvision.models"), name)(**kwargs)

    return make


def _timm(name: str, **kwargs) -> Callable[[], object]:
    """``timm.create_model(name, pretrained=False)``: timm builds its architectures from code."""

    def make():
        _python_torchvision()  # timm imports torchvision
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return make


def use_torchvision_source(folder: Path) -> None:
    """Import ``torchvision.models`` from ``folder`` (an unpacked wheel's ``torchvision``
    folder) without running ``torchvision/__init__.py``, which loads compiled ops these models
    do not use. Only for ``tv_`` models: ``transformers`` reads torchvision's version, which
    this stand-in lacks, so a ``transformers`` model built after this call fails."""
    import importlib.machinery
    import types

    if not (folder / "models" / "__init__.py").is_file():
        raise SystemExit(f"--torchvision-src {folder}: no models/__init__.py there; give the torchvision folder")
    package = types.ModuleType("torchvision")
    package.__path__ = [str(folder)]
    package.__spec__ = importlib.machinery.ModuleSpec("torchvision", None, is_package=True)
    sys.modules["torchvision"] = package


def public_models() -> dict[str, PublicModel]:
    """Every public architecture the sweep knows, by name."""
    image = (1, 3, 224, 224)
    models = [
        PublicModel("hf_resnet50", "cnn", _hf_vision("ResNetForImageClassification", "ResNetConfig"), image),
        PublicModel("hf_resnet34", "cnn", _hf_vision(
            "ResNetForImageClassification", "ResNetConfig", depths=[3, 4, 6, 3], hidden_sizes=[64, 128, 256, 512],
            layer_type="basic"), image),
        PublicModel("hf_mobilenet_v1", "cnn", _hf_vision("MobileNetV1ForImageClassification", "MobileNetV1Config"),
                    image),
        PublicModel("hf_mobilenet_v2", "cnn", _hf_vision("MobileNetV2ForImageClassification", "MobileNetV2Config"),
                    image),
        PublicModel("hf_regnet_y_400mf", "cnn", _hf_vision(
            "RegNetForImageClassification", "RegNetConfig", depths=[1, 3, 6, 6], hidden_sizes=[48, 104, 208, 440],
            groups_width=8, layer_type="y"), image),
        PublicModel("hf_efficientnet_b0", "cnn", _hf_vision(
            "EfficientNetForImageClassification", "EfficientNetConfig", width_coefficient=1.0,
            depth_coefficient=1.0, image_size=224, hidden_dim=1280), image),
        PublicModel("hf_convnext_tiny", "cnn", _hf_vision("ConvNextForImageClassification", "ConvNextConfig"), image),
        PublicModel("hf_poolformer_s12", "cnn", _hf_vision("PoolFormerForImageClassification", "PoolFormerConfig"),
                    image),
        PublicModel("hf_mobilevit_small", "transformer", _hf_vision(
            "MobileViTForImageClassification", "MobileViTConfig"), (1, 3, 256, 256)),
        PublicModel("hf_levit_128s", "transformer", _hf_vision("LevitForImageClassification", "LevitConfig"), image),
        PublicModel("hf_vit_b16", "transformer", _hf_vision("ViTForImageClassification", "ViTConfig"), image),
        PublicModel("hf_deit_small", "transformer", _hf_vision(
            "DeiTForImageClassification", "DeiTConfig", hidden_size=384, num_attention_heads=6,
            intermediate_size=1536), image),
        PublicModel("hf_swin_tiny", "transformer", _hf_vision("SwinForImageClassification", "SwinConfig"), image),
        PublicModel("hf_segformer_b0", "transformer", _hf_vision(
            "SegformerForSemanticSegmentation", "SegformerConfig"), (1, 3, 256, 256)),
        PublicModel("hf_bert_base", "transformer", _hf_text("BertModel", "BertConfig"), (1, 128), "int64"),
        # BERT-tiny's published size (google/bert_uncased_L-2_H-128_A-2).
        PublicModel("hf_bert_tiny", "transformer", _hf_text(
            "BertModel", "BertConfig", hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=512), (1, 128), "int64"),
        PublicModel("hf_distilbert", "transformer", _hf_text("DistilBertModel", "DistilBertConfig"), (1, 128),
                    "int64"),
        PublicModel("hf_gpt2", "transformer", _hf_text("GPT2Model", "GPT2Config"), (1, 64), "int64"),
        PublicModel("torch_encoder_postnorm", "transformer", _torch_encoder, (1, 128, 256)),
        PublicModel("tv_shufflenet_v2_x1_0", "cnn", _torchvision("shufflenet_v2_x1_0"), image),
        PublicModel("tv_vit_b_16", "transformer", _torchvision("vit_b_16"), image),
        PublicModel("tv_swin_t", "transformer", _torchvision("swin_t"), image),
        # The torchvision CNN suite (GROUPS["cnn_suite"]).
        *(PublicModel(f"tv_{name}", "cnn", _torchvision(name), image) for name in (
            "resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "squeezenet1_1",
            "densenet121", "regnet_y_400mf", "mnasnet1_0")),
        # Without the auxiliary heads (used in training only; in train mode, as when batch
        # norm is re-estimated, they would run); init_weights=True is the default that
        # torchvision warns it will change.
        PublicModel("tv_googlenet", "cnn", _torchvision("googlenet", aux_logits=False, init_weights=True), image),
        PublicModel("tv_convnext_tiny", "cnn", _torchvision("convnext_tiny"), image),
        # FastViT-T8 (Vasu et al. 2023): RepMixer blocks, large-kernel depthwise convs, GELU.
        PublicModel("timm_fastvit_t8", "cnn", _timm("fastvit_t8"), (1, 3, 256, 256)),
    ]
    return {m.name: m for m in models}


GROUPS: dict[str, tuple[str, ...]] = {
    # Common CNN architectures, as torchvision defines them.
    "cnn_suite": ("tv_resnet18", "tv_resnet50", "tv_mobilenet_v2", "tv_mobilenet_v3_large", "tv_efficientnet_b0",
                "tv_squeezenet1_1", "tv_densenet121", "tv_regnet_y_400mf", "tv_mnasnet1_0", "tv_googlenet",
                "tv_convnext_tiny"),
    # Encoders and a decoder of the published sizes: ViT-B/16, Swin-T, BERT-base, BERT-tiny,
    # GPT-2 small (64 tokens).
    "transformer_suite": ("tv_vit_b_16", "tv_swin_t", "hf_bert_base", "hf_bert_tiny", "hf_gpt2"),
}
"""Named groups of models, which ``--names`` takes besides model names."""


def select(names=None, kind: str | None = None) -> list[str]:
    """The model names that ``names`` (model and :data:`GROUPS` names; ``None``: every model)
    and ``kind`` (``None``: any) select, each once, in the order given.

    Raises
    ------
    ValueError
        For a name that is neither a model nor a group, or an unknown kind; the message lists
        the choices.
    """
    models = public_models()
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {KINDS}")
    unknown = [n for n in names or () if n not in models and n not in GROUPS]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from the groups {sorted(GROUPS)} "
                         f"or the models {sorted(models)}")
    expanded = [m for n in names for m in GROUPS.get(n, (n,))] if names else list(models)
    return [n for n in dict.fromkeys(expanded) if kind is None or models[n].kind == kind]


def select_or_exit(parser, names, kind: str | None) -> list[str]:
    """:func:`select` for a command line: a bad or empty selection is ``parser.error``."""
    try:
        chosen = select(names, kind)
    except ValueError as err:
        parser.error(str(err))
    if not chosen:
        parser.error(f"no {kind} model among --names {' '.join(names)}")
    return chosen


def example_input(model: PublicModel, *, seed: int = 0, batch: int | None = None):
    """A seeded input of the model's shape, or of ``batch`` rows (token ids below BERT's
    smallest vocabulary)."""
    import torch

    shape = model.input_shape if batch is None else (_batch(batch), *model.input_shape[1:])
    generator = torch.Generator().manual_seed(seed)
    if model.input_dtype == "int64":
        return torch.randint(0, 1000, shape, generator=generator)
    return torch.randn(*shape, generator=generator)


def _batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    return batch


def instantiate(model: PublicModel, *, seed: int = 0):
    """The module in eval mode with seeded weights (no all-zero linear layer) and re-estimated
    batch-norm statistics."""
    import torch

    torch.manual_seed(seed)
    module = model.make()
    for layer in module.modules():
        # Some definitions start a classifier at zero (torchvision's ViT head): every output
        # would be 0 and a comparison with ONNX Runtime would check nothing.
        if isinstance(layer, torch.nn.Linear) and not layer.weight.detach().any():
            torch.nn.init.normal_(layer.weight, std=0.02)
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        generator = torch.Generator().manual_seed(seed)
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # cumulative average over the calibration batches
        module.train()
        with torch.no_grad():
            for _ in range(4):
                module(torch.randn(4, *model.input_shape[1:], generator=generator))
    return module.eval()


def export(name: str, out_dir: Path, *, exporter: str = "torchscript", seed: int = 0, batch: int | None = None) -> Path:
    """Build ``name`` with seeded weights and export it with ``exporter``, for its own batch
    or ``batch`` rows (the file is then named ``<name>.b<batch>``); the ONNX file's path."""
    import torch

    models = public_models()
    if name not in models:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(models)}")
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; choose from {EXPORTERS}")
    model = models[name]
    module = instantiate(model, seed=seed)
    example = example_input(model, seed=seed, batch=batch)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ("" if batch is None else f".b{batch}") + ("" if exporter == "torchscript" else f".{exporter}")
    path = out_dir / f"{name}{suffix}.onnx"
    # Not under no_grad: in eval mode without autograd, nn.TransformerEncoder takes its fused
    # fast path, an op the TorchScript exporter cannot write.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow on shapes
        if exporter == "torchscript":
            torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=17,
                              input_names=[model.input_name], output_names=["output"])
        else:
            program = torch.onnx.export(module, (example,), dynamo=True, verbose=False,
                                        input_names=[model.input_name], output_names=["output"])
            program.save(str(path))
    return path
