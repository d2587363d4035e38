"""Serving a model: many threads calling one model, artifacts checked before they are opened,
inputs by name, and a load that needs TVM's runtime only."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import alt_tvm
from alt_tvm.deploy.artifact import LIBRARY, METADATA, ArtifactError


class _SmallCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(16, 16, 3, stride=2, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


class _TwoInputs(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a) * 2.0 + b


@pytest.fixture(scope="module")
def built():
    torch.manual_seed(0)
    model = _SmallCnn().eval()
    return alt_tvm.build(model, example_inputs=(torch.randn(1, 3, 16, 16),)), model


@pytest.fixture(scope="module")
def artifact(built, tmp_path_factory):
    return built[0].export(tmp_path_factory.mktemp("serving") / "cnn.alt")


def _inputs(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((1, 3, 16, 16)).astype("float32") for _ in range(count)]


def _hammer(model, inputs, *, threads: int, calls: int) -> list[list[np.ndarray]]:
    """``threads`` threads each calling ``model`` ``calls`` times, cycling through ``inputs``;
    each thread's outputs in call order."""
    results: list[list[np.ndarray]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(calls):
                results[t].append(model(inputs[(t + i) % len(inputs)])[0])
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    return results


@pytest.mark.parametrize("which", ["built", "loaded"])
def test_eight_threads_calling_one_model_get_the_single_threaded_outputs(built, artifact, which):
    model = built[0] if which == "built" else alt_tvm.load(artifact)
    inputs = _inputs(5)
    expected = [model(x)[0] for x in inputs]
    with torch.no_grad():
        np.testing.assert_allclose(expected[0], built[1](torch.from_numpy(inputs[0])).numpy(), rtol=1e-4, atol=1e-5)
    results = _hammer(model, inputs, threads=8, calls=50)
    for t, outputs in enumerate(results):
        assert len(outputs) == 50
        for i, out in enumerate(outputs):
            np.testing.assert_array_equal(out, expected[(t + i) % len(inputs)])


def test_inputs_by_name_by_dict_and_in_order(tmp_path):
    torch.manual_seed(0)
    a, b = np.random.default_rng(2).standard_normal((2, 4, 8)).astype("float32")
    model = alt_tvm.build(_TwoInputs().eval(), example_inputs=(torch.from_numpy(a), torch.from_numpy(b)))
    names = model.input_names
    assert len(names) == 2
    expected = np.maximum(a, 0) * 2 + b
    for feeds in ({names[0]: a, names[1]: b}, {names[1]: b, names[0]: a}):
        np.testing.assert_allclose(model(**feeds)[0], expected, rtol=1e-6)
        np.testing.assert_allclose(model(feeds)[0], expected, rtol=1e-6)
    np.testing.assert_allclose(model(a, b)[0], expected, rtol=1e-6)
    with pytest.raises(ValueError, match=rf"inputs are \['{names[0]}', '{names[1]}'\]; unknown \['c'\]"):
        model(**{names[0]: a, names[1]: b, "c": b})
    with pytest.raises(ValueError, match=rf"missing \['{names[1]}'\]"):
        model({names[0]: a})
    with pytest.raises(TypeError, match="by position or by name, not both"):
        model(a, **{names[1]: b})
    loaded = alt_tvm.load(model.export(tmp_path / "two.alt"))
    np.testing.assert_allclose(loaded(**{names[1]: b, names[0]: a})[0], expected, rtol=1e-6)
    assert loaded.time(**{names[0]: a, names[1]: b}, number=2, repeat=2)[0] > 0


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_cut, _flip, Path.unlink], ids=["cut", "flipped", "deleted"])
@pytest.mark.parametrize("name", [LIBRARY, METADATA])
def test_a_damaged_artifact_is_a_clear_error_before_its_library_is_opened(artifact, tmp_path, damage, name):
    import shutil

    copy = Path(shutil.copytree(artifact, tmp_path / "copy.alt"))
    damage(copy / name)
    with pytest.raises(ArtifactError, match=rf"copy\.alt.*{name}|{name}.*copy\.alt") as info:
        alt_tvm.load(copy)
    assert name in str(info.value)


def test_metadata_edited_to_a_valid_document_is_refused(artifact, tmp_path):
    import shutil

    copy = Path(shutil.copytree(artifact, tmp_path / "edited.alt"))
    metadata = json.loads((copy / METADATA).read_text())
    metadata["inputs"][0]["shape"] = [2, 3, 16, 16]  # still JSON, still an artifact: a wrong batch
    (copy / METADATA).write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match="model.json does not match its checksum"):
        alt_tvm.load(copy)


_FRESH_LOAD = """
import sys, time
started = time.perf_counter()
import numpy as np
import alt_tvm
model = alt_tvm.load(sys.argv[1])
x = np.load(sys.argv[2])
out = model(x)[0]
np.save(sys.argv[3], out)
compiler = [line for line in open("/proc/self/maps") if "libtvm_compiler" in line]
heavy = sorted(m for m in sys.modules if m in ("tvm", "torch") or m.startswith(("alt_tvm.graph", "alt_tvm.strategies",
                                                                             "alt_tvm.tuning", "alt_tvm.target")))
print(heavy, len(compiler))
"""


def test_a_fresh_process_loads_and_runs_an_artifact_without_the_compiler(built, artifact, tmp_path):
    x = _inputs(1)[0]
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", _FRESH_LOAD, str(artifact), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0].strip() == "[] 0", done.stdout  # no tvm, torch or build module; no compiler
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), built[0](x)[0])
