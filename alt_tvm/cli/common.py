"""What the ``alt-tvm`` subcommands share: one-line argument errors, the model argument, logging."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

#: What the MODEL argument of ``build``, ``bench`` and ``profile`` accepts, for help texts.
MODEL_HELP = ("an ONNX file, a reference model name (alt_tvm.models.MODEL_NAMES), or (bench, profile) an "
              "artifact directory written by `alt-tvm build -o`")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (``alt-tvm CMD: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser_for(command: str, doc: str | None) -> Parser:
    return Parser(prog=f"alt-tvm {command}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_output_options(parser: Parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log the build's summary and TVM's own messages to stderr")


def configure_logging(verbose: bool) -> None:
    """Warnings of the ``alt_tvm`` logger on stderr; with ``verbose`` also its INFO and TVM's DEBUG lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("alt_tvm")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)


def unwritable(path: str) -> str | None:
    """Why a file cannot be created or appended to at ``path`` (None: it can); creates nothing."""
    if not os.path.basename(path):
        return f"{path!r} names a directory, not a file"
    if os.path.isdir(path):
        return f"{path!r} is a directory, not a file"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else f"{path!r} is not writable"
    return _uncreatable_parent(path)


def _uncreatable_parent(path: str) -> str | None:
    parent = os.path.dirname(os.path.abspath(path))
    ancestor = parent
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"cannot create directory {parent!r}: {ancestor!r} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {path!r}: directory {ancestor!r} is not writable"
    return None


def unwritable_directory(path: str) -> str | None:
    """Why an artifact directory cannot be written at ``path`` (None: it can)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{path!r} is an existing file; an artifact is a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"directory {path!r} is not writable"
    return _uncreatable_parent(os.path.join(path, "model.so"))


def target_problem(name: str | None) -> str | None:
    """What is wrong with a ``--target`` name (None: nothing): a board, ``host``,
    ``cpu:<LLVM CPU>`` or ``cuda[:N]``, as :func:`alt_tvm.target.board` reads them."""
    if name is None or name == "host":
        return None
    from alt_tvm.target import board  # imports TVM

    try:
        board(name)
    except (ValueError, RuntimeError) as err:
        return f"--target: {err}"
    return None


@dataclass(frozen=True)
class ModelArgument:
    """What a MODEL argument names: ``kind`` is ``"artifact"``, ``"onnx"`` or ``"reference"``."""

    text: str
    kind: str

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(os.path.normpath(self.text)))[0]


def model_argument(text: str, *, artifacts: bool) -> ModelArgument | str:
    """The model ``text`` names, or why it names none (a one-line message)."""
    from alt_tvm.models import MODEL_NAMES

    if artifacts and os.path.isdir(text):
        if not os.path.isfile(os.path.join(text, "model.json")):
            return f"{text!r} is a directory but not an artifact (no model.json); write one with `alt-tvm build -o`"
        return ModelArgument(text, "artifact")
    if os.path.isfile(text):
        return ModelArgument(text, "onnx")
    if text in MODEL_NAMES:
        return ModelArgument(text, "reference")
    allowed = "an ONNX file, an artifact directory" if artifacts else "an ONNX file"
    return f"{text!r} is neither {allowed} nor a reference model ({', '.join(MODEL_NAMES)})"


def require_positive(parser: Parser, options: dict[str, int | None]) -> None:
    """Exit with a one-line error for the first option below 1 (None: not given)."""
    for option, value in options.items():
        if value is not None and value < 1:
            parser.error(f"{option} must be >= 1, got {value}")


def checked_model(parser: Parser, text: str, records: str | None, *, artifacts: bool) -> ModelArgument:
    """The MODEL argument and its ``--records``, or exit with a one-line error saying what is wrong."""
    model = model_argument(text, artifacts=artifacts)
    if isinstance(model, str):
        parser.error(model)
    if model.kind == "artifact" and records is not None:
        parser.error("--records applies when building MODEL; an artifact was built already")
    if records is not None and not os.path.isfile(records):
        parser.error(f"--records: tuning log {records!r} does not exist")
    return model


def build_model(model: ModelArgument, *, records: str | None = None, target: str | None = None,
                priors: str = "auto") -> Any:
    """Build an ONNX file or reference model with alt-tvm, with the build options its flags give
    (``--records``, ``--target``, ``--priors``: ``auto``, ``none`` or a priors file)."""
    import alt_tvm
    from alt_tvm.options import BuildOptions

    options = BuildOptions(target=target, records=records, priors=None if priors == "none" else priors)
    if model.kind == "reference":
        from alt_tvm.models import get_model

        module, inputs = get_model(model.text)
        built = alt_tvm.build(module, options, example_inputs=inputs)
        built.source = model.text
        return built
    return alt_tvm.build(model.text, options)


def runnable(model: ModelArgument, *, records: str | None = None) -> Any:
    """A model to run here: the artifact loaded, or the ONNX file / reference model built."""
    if model.kind == "artifact":
        import alt_tvm

        return alt_tvm.load(model.text)
    return build_model(model, records=records)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1))
