"""Compiled-model artifacts: written once by ``CompiledModel.export``, run anywhere by :func:`load`.

An artifact is a directory of two files:

``model.so``
    The Relax VM executable with its weights (TVM's ``export_library``), linked by the
    target's gcc: the host's, or a cross gcc for a board (an ELF of the board's machine).
``model.json``
    What the library cannot say about itself: the input names, shapes and dtypes, the
    build report, what each kernel computes (for :meth:`~RunnableModel.profile`), the
    versions of the artifact format, alt-tvm and TVM, the target it was built for and the
    instruction-set features its code uses; the size and SHA-256 of ``model.so``; and a
    SHA-256 of the metadata itself.

Loading checks, before the library is opened: the metadata's own checksum, the library's size
and checksum (a copy cut short or a flipped bit would otherwise crash the process when the
loader maps it), the format and TVM versions (the library calls TVM's runtime ABI) and, for a
local run, that this machine has the code's instruction-set features. Each failure is an
:class:`ArtifactError` naming the file and what is wrong. Loading needs TVM's runtime only
(:mod:`.runtime`): no compiler is imported.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alt_tvm import __version__
from alt_tvm.isa import is_x86, machine_flags, missing_features
from alt_tvm.native_log import tvm_output_to_log

from . import runtime
from .model import RunnableModel, kernel_info_from_json, kernel_info_to_json, use_runtime_threads
from .parallel import LauncherError, install, launcher_object
from .profile import KernelInfo

if TYPE_CHECKING:
    from alt_tvm.target import HardwareTarget

__all__ = ["ARTIFACT_VERSION", "ArtifactError", "LoadedModel", "load_local", "read_metadata", "write_artifact"]

#: Version of the artifact layout; bumped when ``model.json`` changes incompatibly.
ARTIFACT_VERSION = 2
LIBRARY = "model.so"
METADATA = "model.json"
_FORMAT = "alt-tvm-artifact"

class ArtifactError(RuntimeError):
    """An artifact cannot be loaded here: missing or corrupt files, or a version or target mismatch."""


def _host_arch() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def write_artifact(path: str | os.PathLike, *, executable: Any, target: HardwareTarget, input_names: Sequence[str],
                   input_shapes: Sequence[Sequence[int]], input_dtypes: Sequence[str],
                   kernels: Mapping[str, KernelInfo], report: str, source: str | None = None) -> Path:
    """Write a compiled model as an artifact directory at ``path`` (created; files in it replaced).

    Parameters
    ----------
    executable
        ``tvm.compile``'s Relax executable, built for ``target``.
    target
        What it was built for; a board's ``cross_compiler`` links the library.
    kernels
        What each kernel computes (``CompiledModel.kernel_info()``).
    report
        The build report's summary.
    source
        The model it was built from (a path or reference model name), for ``alt-tvm bench``.

    Returns
    -------
    Path
        The artifact directory.

    Raises
    ------
    ArtifactError
        If ``path`` is an existing file, the target's cross compiler is missing, or it
        cannot compile alt-tvm's parallel launcher.
    """
    import tvm

    from alt_tvm.target import isa_features
    from alt_tvm.toolchain import elf_machine, export_library, require_cross_compiler

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"artifact path {os.fspath(out)!r} is an existing file; an artifact is a directory")
    out.mkdir(parents=True, exist_ok=True)
    library = out / LIBRARY
    if target.cross_compiler is not None:
        require_cross_compiler(target.cross_compiler, purpose=f"links the model for target {target.name!r}")
    try:
        launcher = launcher_object(target.cross_compiler)
    except LauncherError as err:
        raise ArtifactError(f"artifact {os.fspath(out)!r} for target {target.name!r}: {err}") from err
    with tvm_output_to_log():
        export_library(executable, library, cross_compiler=target.cross_compiler, addons=[launcher])
    metadata = {
        "format": _FORMAT,
        "artifact_version": ARTIFACT_VERSION,
        "alt_tvm_version": __version__,
        "tvm_version": tvm.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": {"name": target.name, "description": target.description, "tvm": dict(target.tvm_target),
                   "num_cores": target.num_cores, "cross_compiler": target.cross_compiler,
                   "isa_features": isa_features(target)},
        "machine": elf_machine(library),
        "files": {LIBRARY: _file_digest(library)},
        "inputs": [{"name": name, "shape": list(shape), "dtype": dtype}
                   for name, shape, dtype in zip(input_names, input_shapes, input_dtypes)],
        "source": source,
        "report": report,
        "kernels": kernel_info_to_json(kernels),
    }
    metadata["checksum"] = _metadata_digest(metadata)
    (out / METADATA).write_text(json.dumps(metadata, indent=1) + "\n")
    return out


def _file_digest(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def _metadata_digest(metadata: Mapping[str, Any]) -> str:
    """SHA-256 of the metadata without its ``checksum`` entry, in a canonical JSON form."""
    body = {k: v for k, v in metadata.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """An artifact's ``model.json``, its files checked against their sizes and checksums, and
    checked for format and TVM version (not for the machine).

    Raises
    ------
    ArtifactError
        Naming the path, the file and what is wrong: not an artifact directory, a file
        missing, cut short or altered, unreadable or corrupt metadata, another artifact
        format or TVM version.
    """
    root = Path(path)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is a file"
        raise ArtifactError(f"artifact {os.fspath(root)!r} {what}; an artifact is the directory that "
                            f"CompiledModel.export or `alt-tvm build -o` writes")
    for name in (METADATA, LIBRARY):
        if not (root / name).is_file():
            raise ArtifactError(f"artifact {os.fspath(root)!r} has no {name} (incomplete copy?); export it again")
    try:
        metadata = json.loads((root / METADATA).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"artifact {os.fspath(root)!r}: {METADATA} is not readable JSON ({err})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != _FORMAT:
        raise ArtifactError(f"artifact {os.fspath(root)!r}: {METADATA} is not alt-tvm artifact metadata")
    version = metadata.get("artifact_version")
    if version != ARTIFACT_VERSION:
        raise ArtifactError(f"artifact {os.fspath(root)!r} has format version {version!r}, this alt-tvm "
                            f"({__version__}) reads version {ARTIFACT_VERSION}: rebuild it with this alt-tvm")
    if metadata.get("checksum") != _metadata_digest(metadata):
        raise ArtifactError(f"artifact {os.fspath(root)!r}: {METADATA} does not match its checksum (altered or "
                            f"damaged in the copy); copy the artifact again")
    missing = [k for k in ("tvm_version", "target", "inputs", "kernels", "report", "files") if k not in metadata]
    if missing:
        raise ArtifactError(f"artifact {os.fspath(root)!r}: {METADATA} lacks {missing}")
    for name, expected in metadata["files"].items():
        found = root / name
        size = found.stat().st_size
        if size != expected.get("size"):
            raise ArtifactError(f"artifact {os.fspath(root)!r}: {name} has {size} bytes, {expected.get('size')} "
                                f"were written (cut short or replaced in the copy?); copy the artifact again")
        if _file_digest(found)["sha256"] != expected.get("sha256"):
            raise ArtifactError(f"artifact {os.fspath(root)!r}: {name} does not match its SHA-256 (damaged in the "
                                f"copy?); copy the artifact again")
    installed = runtime.tvm_version()
    if metadata["tvm_version"] != installed:
        raise ArtifactError(f"artifact {os.fspath(root)!r} was built with TVM {metadata['tvm_version']}, this "
                            f"process runs TVM {installed} (a library must run with the TVM that built it): "
                            f"rebuild it here")
    return metadata


def _not_for_this_machine(metadata: Mapping[str, Any]) -> str | None:
    """Why the artifact's code cannot run on this machine (None: it can)."""
    target = metadata["target"]
    machine, mine = metadata.get("machine"), _host_arch()
    if machine != mine:
        return (f"it holds {machine} code for {target['name']!r} and this machine is {mine}: run it on the board "
                f"(alt_tvm.load there, or alt_tvm.load(path, remote='host:port', key=...) through a tracker)")
    why = _lacks(target)
    if why is not None:
        return (f"{why}: rebuild it here (alt-tvm build MODEL -o DIR), or load it with check_cpu=False if "
                f"cpuinfo hides a feature this CPU has (an instruction it lacks stops the process)")
    return None


def _lacks(target: Mapping[str, Any]) -> str | None:
    """Why this machine cannot run the code of ``target`` (the metadata's entry), or None.

    On x86: the instruction-set features the artifact lists against this machine's cpuinfo
    flags. Elsewhere cpuinfo names features otherwise than LLVM: a named CPU must be this
    machine's, asked of LLVM where a compiler is loaded already (this process builds)."""
    cpu = target["tvm"].get("mcpu")
    if is_x86():
        have = machine_flags()
        missing = missing_features(target.get("isa_features", ()), have) if have else []
        if missing:
            return f"it was built for CPU {cpu or 'generic'!r}, whose features {', '.join(missing)} this machine lacks"
        return None
    if cpu and cpu != "generic" and "tvm" in sys.modules:
        from alt_tvm.target import not_on_host

        return not_on_host(target["tvm"])
    return None


class LoadedModel(RunnableModel):
    """A model read from an artifact: call, ``time`` and ``profile`` it like the built one.

    Attributes
    ----------
    metadata : dict
        The artifact's ``model.json`` (versions, target, inputs, source model).
    report : str
        The build report's summary.
    path : Path
        The artifact directory.
    """

    def __init__(self, executable: Any, metadata: Mapping[str, Any], path: Path, *, device: Any = None,
                 threads: int | None = None) -> None:
        inputs = metadata["inputs"]
        super().__init__(executable, input_names=[i["name"] for i in inputs],
                         input_shapes=[i["shape"] for i in inputs], input_dtypes=[i["dtype"] for i in inputs],
                         device=device, threads=threads)
        self.metadata = dict(metadata)
        self.report = str(metadata["report"])
        self.path = path
        self._kernels = kernel_info_from_json(metadata["kernels"])

    @property
    def source(self) -> str | None:
        """The model the artifact was built from (a path or reference model name), if known."""
        return self.metadata.get("source")

    def kernel_info(self) -> dict[str, KernelInfo]:
        return dict(self._kernels)


def load_local(path: str | os.PathLike, *, device: Any = None, check_cpu: bool = True) -> LoadedModel:
    """Load an artifact to run in this process (see :func:`alt_tvm.deploy.load.load`).

    Raises
    ------
    ArtifactError
        As :func:`read_metadata`, or the code was built for another machine.
    """
    metadata = read_metadata(path)
    root = Path(path)
    kind = metadata["target"]["tvm"].get("kind", "llvm")
    if kind != "llvm":
        # This loader runs TVM's CPU runtime alone; a GPU model runs where it is built.
        raise ArtifactError(f"artifact {os.fspath(root)!r}: it holds {kind} code for {metadata['target']['name']!r}, "
                            f"and alt_tvm.load runs CPU code only: build the model on the GPU machine with "
                            f"alt_tvm.build(model, target='cuda') and call it there")
    problem = _not_for_this_machine(metadata)
    if problem is not None and (check_cpu or metadata.get("machine") != _host_arch()):
        raise ArtifactError(f"artifact {os.fspath(root)!r}: {problem}")
    threads = use_runtime_threads(int(metadata["target"]["num_cores"]))
    with tvm_output_to_log():
        executable = runtime.load_module(root / LIBRARY)
    on_cpu = device is None or device.dlpack_device_type() == runtime.cpu().dlpack_device_type()
    model = LoadedModel(executable, metadata, root, device=device, threads=threads if on_cpu else None)
    if on_cpu and threads > 1:
        model._use_launcher(install(root / LIBRARY, threads=threads))
    return model
