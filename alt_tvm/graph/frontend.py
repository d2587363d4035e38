"""Model import: ONNX files/protos, PyTorch modules and Relax modules to one Relax ``IRModule``.

Every importer produces the same thing, an :class:`ImportedModel`: a Relax module whose
``main`` takes only the model inputs, with static shapes (batch fixed at import), and whose
weights are bound into the module as constants (``relax.const`` nodes, printed as
``metadata["ir.GenericConst"][i]``), so that compile-time passes can fold BatchNorm or
re-layout weights without the caller feeding parameters.

* ONNX: dynamic input dims are fixed from ``input_shapes`` (a dynamic batch, dim 0, defaults
  to 1; no other dim is guessed), the graph's shape computations are folded to constants
  (:mod:`.onnx_fold`), then ``tvm.relax.frontend.onnx.from_onnx(model, shape_dict, dtype_dict,
  keep_params_in_input=False)``.
* PyTorch: ``torch.export.export(module, example_inputs)`` (or a program the user exported)
  then ``tvm.relax.frontend.torch.from_exported_program(ep, keep_params_as_input=False)``.
* Relax: passed through; the signature is read from ``main`` (symbolic dims may be fixed with
  ``input_shapes``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from .onnx_fold import (
    fold_static_shapes,
    merge_pads_into_convs,
    resolve_conv_auto_pads,
    resolve_conv_transpose_output_shapes,
)

__all__ = ["ImportedModel", "ModelImportError", "load_model"]


class ModelImportError(ValueError):
    """A model could not be imported; the message names the input and the reason."""


@dataclass(frozen=True)
class ImportedModel:
    """A model imported into Relax, with a static signature.

    Attributes
    ----------
    mod : tvm.IRModule
        Relax module; ``main`` takes exactly the model inputs, in the order of ``input_names``,
        and the weights are constants inside the module.
    input_names : tuple of str
        Input names as the source calls them (ONNX graph input names, ``forward`` argument
        names, or Relax parameter names). ``main``'s parameters may be sanitised versions.
    input_shapes : tuple of tuple of int
        Static shape of each input.
    input_dtypes : tuple of str
        dtype of each input (e.g. ``"float32"``, ``"int64"``).
    output_names : tuple of str
        Output names in output order (ONNX graph outputs, the exported program's output
        nodes, or ``output_<i>`` for a Relax module).
    source : str
        ``"onnx"``, ``"torch"`` or ``"relax"``.
    """

    mod: tvm.IRModule
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_names: tuple[str, ...]
    source: str


def load_model(model: Any, *, example_inputs: Sequence[Any] | Any | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> ImportedModel:
    """Import ``model`` into Relax with weights bound as constants and static input shapes.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto, torch.nn.Module, torch.export.ExportedProgram or tvm.IRModule
        An ONNX file, an ONNX model, a PyTorch module (in eval mode; needs ``example_inputs``),
        a program from ``torch.export.export`` (static shapes) or a Relax module with a
        ``main`` function (passed through).
    example_inputs : tuple of torch.Tensor or torch.Tensor, optional
        Inputs to trace a PyTorch module with (``torch.export``); their shapes are the model's.
    input_shapes : mapping of str to sequence of int, optional
        Shapes of named inputs. For ONNX they replace dynamic dims and must agree with the
        static ones; a dynamic batch (dim 0) not given here becomes 1, any other dynamic dim
        (height, width, sequence length) must be given;
        for a Relax module they fix symbolic dims; for PyTorch they must match
        ``example_inputs``.

    Returns
    -------
    ImportedModel

    Raises
    ------
    ModelImportError
        A missing file, a file that is not a valid ONNX model, a PyTorch module without
        example inputs (or in training mode), an unsupported object, shapes that do not fit
        the model, or a failure of TVM's frontend (the original error is chained).
    """
    shapes = _check_input_shapes(input_shapes)
    if isinstance(model, (str, os.PathLike)):
        if not os.fspath(model):
            raise ModelImportError("the model path is empty; give the path of an ONNX file")
        return _import_onnx(_read_onnx_file(Path(model)), shapes)
    if isinstance(model, tvm.IRModule):
        return _import_relax(model, shapes)
    onnx = _optional_import("onnx")
    if onnx is not None and isinstance(model, onnx.ModelProto):
        _check_onnx(model, "the given onnx.ModelProto")
        return _import_onnx(model, shapes)
    torch = _optional_import("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return _import_torch(model, example_inputs, shapes)
    if torch is not None and isinstance(model, torch.export.ExportedProgram):
        if example_inputs is not None:
            raise ModelImportError("an ExportedProgram is imported at its traced shapes; do not pass example_inputs")
        return _import_exported(model, "ExportedProgram", shapes)
    raise ModelImportError(
        f"cannot import an object of type {type(model).__module__}.{type(model).__qualname__}; expected a path to "
        "an ONNX file, an onnx.ModelProto, a torch.nn.Module (with example_inputs), a torch.export.ExportedProgram "
        "or a Relax tvm.IRModule"
    )


# --------------------------------------------------------------------------------------------- helpers


def _optional_import(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None


def _check_input_shapes(input_shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    if input_shapes is None:
        return {}
    if not isinstance(input_shapes, Mapping):
        raise ModelImportError(f"input_shapes must be a mapping from input name to shape, got {type(input_shapes)}")
    out = {}
    for name, shape in input_shapes.items():
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ModelImportError(f"input_shapes[{name!r}] must be a sequence of ints, got {shape!r}") from None
        if any(d < 1 for d in dims):
            raise ModelImportError(f"input_shapes[{name!r}] must have positive dims, got {dims}")
        out[str(name)] = dims
    return out


def _check_unknown_names(shapes: Mapping[str, tuple[int, ...]], names: Sequence[str]) -> None:
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ModelImportError(f"input_shapes names unknown inputs {unknown}; the model's inputs are {list(names)}")


def _signature(mod: tvm.IRModule, what: str) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """Names, static shapes and dtypes of ``main``'s parameters (all must be static tensors)."""
    names, shapes, dtypes = [], [], []
    for param in mod["main"].params:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
            raise ModelImportError(f"{what}: input {param.name!r} is not a tensor of known rank ({ty})")
        dims = []
        for d in ty.shape.values:
            if not isinstance(d, tvm.tirx.IntImm):
                raise ModelImportError(
                    f"{what}: input {param.name!r} has a symbolic dim {d} in shape {ty.shape}; "
                    "give its shape with input_shapes={name: shape}"
                )
            dims.append(int(d.value))
        names.append(param.name)
        shapes.append(tuple(dims))
        dtypes.append(str(ty.dtype))
    return tuple(names), tuple(shapes), tuple(dtypes)


def _num_outputs(mod: tvm.IRModule) -> int:
    ret = mod["main"].ret_ty
    return len(ret.fields) if isinstance(ret, relax.TupleType) else 1


# ------------------------------------------------------------------------------------------------ ONNX


def _read_onnx_file(path: Path) -> Any:
    if not path.exists():
        raise ModelImportError(f"model file {str(path)!r} does not exist")
    if not path.is_file():
        raise ModelImportError(f"model path {str(path)!r} is not a file")
    onnx = _optional_import("onnx")
    if onnx is None:
        raise ModelImportError(f"cannot read {str(path)!r}: the onnx package is not installed")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf raises DecodeError, RuntimeWarning-like errors, ...
        raise ModelImportError(f"{str(path)!r} is not a valid ONNX model (could not parse it: {err})") from err
    _check_onnx(model, repr(str(path)))
    return model


def _check_onnx(model: Any, what: str) -> None:
    import onnx

    # A random byte string can parse as an (empty) ModelProto: require an actual graph.
    if not model.HasField("graph") or len(model.graph.node) == 0 or not model.opset_import:
        raise ModelImportError(f"{what} is not a valid ONNX model (no graph nodes or no opset)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        raise ModelImportError(f"{what} is not a valid ONNX model: {err}") from err


def _import_onnx(model: Any, shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    from onnx import helper
    from tvm.relax.frontend.onnx import from_onnx

    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]  # old exporters list weights as inputs
    names = [i.name for i in inputs]
    _check_unknown_names(shapes, names)
    shape_dict, dtype_dict = {}, {}
    for inp in inputs:
        tensor_type = inp.type.tensor_type
        if not inp.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
            raise ModelImportError(f"ONNX input {inp.name!r} is not a tensor of known rank")
        # A dim_value of 0 is a static empty axis (ONNX: an unknown dim has no dim_value).
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        names_of = [d.dim_param or "?" for d in tensor_type.shape.dim]
        given = shapes.get(inp.name)
        if given is not None:
            if len(given) != len(dims) or any(d is not None and d != g for d, g in zip(dims, given)):
                shown = tuple(d if d is not None else "?" for d in dims)
                raise ModelImportError(
                    f"input_shapes[{inp.name!r}] = {given} does not fit the ONNX input's shape {shown}"
                )
            dims = list(given)
        for axis, d in enumerate(dims):
            if d is None and axis > 0:  # only the batch may be guessed: any other size changes the model
                shown = tuple(v if v is not None else names_of[i] for i, v in enumerate(dims))
                example = ", ".join(str(v) if v is not None else "1" if i == 0 else f"<{names_of[i]}>"
                                    for i, v in enumerate(dims))
                raise ModelImportError(
                    f"ONNX input {inp.name!r} has a dynamic dim {axis} ({names_of[axis]!r}) in shape {shown}; "
                    f"only a dynamic batch (dim 0) is fixed to 1 by default. Give the shape: "
                    f"input_shapes={{{inp.name!r}: ({example})}}"
                )
        shape_dict[inp.name] = [1 if d is None else d for d in dims]
        dtype_dict[inp.name] = str(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    # Shape-computing subgraphs become constants, so every reshape has a known target shape.
    model = fold_static_shapes(model, input_shapes=shape_dict).model
    resolve_conv_auto_pads(model)  # before merging pads: a merge needs explicit conv pads
    merge_pads_into_convs(model)
    try:
        resolve_conv_transpose_output_shapes(model)
    except ValueError as err:
        raise ModelImportError(str(err)) from err
    try:
        mod = from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict, keep_params_in_input=False)
    except Exception as err:
        raise ModelImportError(f"TVM's ONNX frontend could not import the model: {type(err).__name__}: {err}") from err
    _, in_shapes, in_dtypes = _signature(mod, "imported ONNX model")
    out_names = tuple(o.name for o in graph.output)
    return ImportedModel(mod, tuple(names), in_shapes, in_dtypes, out_names, "onnx")


# --------------------------------------------------------------------------------------------- PyTorch


def _import_torch(module: Any, example_inputs: Any, shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    import torch

    name = type(module).__name__
    if example_inputs is None:
        raise ModelImportError(
            f"importing the torch module {name} needs example_inputs (a tuple of tensors to trace it with)"
        )
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, Sequence) or not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise ModelImportError(f"example_inputs for {name} must be a torch.Tensor or a tuple of them")
    if module.training:
        # BatchNorm/dropout in training mode would be exported with batch statistics/randomness.
        raise ModelImportError(f"the torch module {name} is in training mode; call .eval() before importing it")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(module, tuple(example_inputs))
    except Exception as err:
        raise ModelImportError(f"torch.export could not trace {name}: {type(err).__name__}: {err}") from err
    return _import_exported(exported, name, shapes)


def _import_exported(exported: Any, name: str, shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    """An ``ExportedProgram`` (from ``torch.export.export``) into Relax, at its traced shapes."""
    from tvm.relax.frontend.torch import from_exported_program

    user_inputs = tuple(exported.graph_signature.user_inputs)
    _check_unknown_names(shapes, user_inputs)
    placeholders = {node.name: node for node in exported.graph.nodes if node.op == "placeholder"}
    for input_name in user_inputs:
        value = placeholders[input_name].meta.get("val") if input_name in placeholders else None
        traced = tuple(value.shape) if value is not None else None
        if traced is not None and not all(isinstance(d, int) for d in traced):
            raise ModelImportError(
                f"the exported program {name} has a dynamic shape {traced} for input {input_name!r}; "
                "export it with static shapes (torch.export.export without dynamic_shapes)"
            )
        if input_name in shapes and traced is not None and shapes[input_name] != traced:
            raise ModelImportError(
                f"input_shapes[{input_name!r}] = {shapes[input_name]} differs from the example input's shape "
                f"{traced}; a torch module is imported at its example inputs' shapes"
            )
    try:
        with warnings.catch_warnings():
            # torch's own deprecation notices, raised inside TVM's frontend: nothing the user can act on
            warnings.simplefilter("ignore", FutureWarning)
            mod = from_exported_program(exported, keep_params_as_input=False)
    except Exception as err:
        raise ModelImportError(
            f"TVM's PyTorch frontend could not import {name}: {type(err).__name__}: {err}"
        ) from err
    _, in_shapes, in_dtypes = _signature(mod, f"imported torch module {name}")
    out_names = tuple(str(o) for o in exported.graph_signature.user_outputs)
    return ImportedModel(mod, user_inputs, in_shapes, in_dtypes, out_names, "torch")


# ----------------------------------------------------------------------------------------------- Relax


def _import_relax(mod: tvm.IRModule, shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    has_main = any(g.name_hint == "main" for g in mod.get_global_vars())
    main = mod["main"] if has_main else None
    if not isinstance(main, relax.Function):
        raise ModelImportError("the IRModule has no Relax function 'main' to import")
    num_input = main.attrs.get("num_input") if main.attrs is not None else None
    if num_input is not None and int(num_input) < len(main.params):
        raise ModelImportError(
            f"the IRModule's main takes {len(main.params) - int(num_input)} weights as parameters (num_input="
            f"{int(num_input)}); bind them first, e.g. relax.transform.BindParams('main', params)(mod)"
        )
    names = [p.name for p in main.params]
    _check_unknown_names(shapes, names)
    bindings: dict[str, int] = {}
    for param in main.params:
        given = shapes.get(param.name)
        ty = param.ty
        if given is None or not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            continue
        values = ty.shape.values
        if len(values) != len(given):
            raise ModelImportError(f"input_shapes[{param.name!r}] = {given} has rank {len(given)}, "
                                   f"the input has shape {ty.shape}")
        for dim, value in zip(values, given):
            if isinstance(dim, tvm.tirx.IntImm):
                if int(dim.value) != value:
                    raise ModelImportError(f"input_shapes[{param.name!r}] = {given} does not fit the shape {ty.shape}")
            elif isinstance(dim, tvm.tirx.Var):
                if bindings.setdefault(dim.name, value) != value:
                    raise ModelImportError(f"symbolic dim {dim.name} is given two values by input_shapes")
            else:
                raise ModelImportError(f"input {param.name!r} has a computed dim {dim}; cannot fix it by name")
    if bindings:
        mod = mod.clone()  # leave the caller's module as it was
        mod.update_func(mod.get_global_var("main"), main.bind_symbolic_vars(bindings))
    in_names, in_shapes, in_dtypes = _signature(mod, "the Relax IRModule")
    out_names = tuple(f"output_{i}" for i in range(_num_outputs(mod)))
    return ImportedModel(mod, in_names, in_shapes, in_dtypes, out_names, "relax")
