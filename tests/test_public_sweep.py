"""The public-model sweep (``scripts/sweep_public.py``): every architecture, both exporters,
builds with alt-tvm and matches ONNX Runtime. Slow (about 20 minutes on 2 cores): each model
is exported twice, built twice and checked in a child process of its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import export_public  # noqa: E402
import sweep_public  # noqa: E402


def _available(name: str) -> bool:
    if not name.startswith("tv_"):
        return True
    try:
        import torchvision.models  # noqa: F401
    except Exception:  # noqa: BLE001 - no torchvision wheel matches this torch
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(export_public.public_models()))
def test_every_public_architecture_builds_and_matches_onnx_runtime(name, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    if not _available(name):
        pytest.skip("torchvision is not importable with this torch")
    args = sweep_public.parse_args(["--names", name, "--export-dir", str(tmp_path), "--rounds", "0",
                                    "--timeout", "1500"])
    row = sweep_public.run_in_child(name, args)
    assert "error" not in row, row.get("error")
    exported = {e: entry for e, entry in row["exporters"].items() if entry.get("status") != "export failed"}
    assert "torchscript" in exported, row["exporters"]["torchscript"]
    for exporter, entry in exported.items():
        assert entry["status"] == "ok", (exporter, entry)
        assert entry["max_rel_error"] < 1e-4 and not entry["fallbacks"]
