"""alt-tvm: joint layout and loop optimisation, and operator strategies, for Apache TVM."""

from setuptools import setup

# TVM 0.27 ships only on this line; the newer ffi (0.1.15.x) segfaults in tvm.ir.save_json.
RUNTIME = [
    "apache-tvm==0.27.0.post1",
    "apache-tvm-ffi==0.1.14.post1",
    "numpy>=1.26",
    "torch==2.13.0",
    "xgboost>=2.1",
    "onnx>=1.16",
    "onnxruntime>=1.18",
    "ortools>=9.10",
    "psutil>=5.9",
    "tornado>=6.4",
    "cloudpickle>=3.0",
    "tqdm>=4.66",
    "matplotlib>=3.8",
]

setup(
    name="alt-tvm",
    version="0.1.0",
    description="Layout primitives, joint layout+loop tuning and operator strategies for Apache TVM",
    python_requires=">=3.10",
    packages=[
        "alt_tvm",
        "alt_tvm.bench",
        "alt_tvm.cli",
        "alt_tvm.layout",
        "alt_tvm.ops",
        "alt_tvm.graph",
        "alt_tvm.deploy",
        "alt_tvm.models",
        "alt_tvm.strategies",
        "alt_tvm.strategies.alt",
        "alt_tvm.strategies.sconv",
        "alt_tvm.strategies.tt",
        "alt_tvm.strategies.vta",
        "alt_tvm.tuning",
        "alt_tvm.tuning.measure",
        "alt_tvm.vta_mapping",
    ],
    package_dir={
        "alt_tvm": "alt_tvm",
        "alt_tvm.tuning": "tuning",
        "alt_tvm.strategies": "strategies",
        "alt_tvm.vta_mapping": "vta_mapping",
    },
    # the parallel launcher's C source, compiled and linked into every model library
    package_data={"alt_tvm.deploy": ["parallel.c"], "alt_tvm": ["data/priors.json", "data/rvv_harness.c"]},
    install_requires=RUNTIME,
    entry_points={"console_scripts": ["alt-tvm=alt_tvm.cli:main"]},
    extras_require={
        # transformers: public architecture definitions (built from configs, offline) that the
        # tests export and build; onnxscript: PyTorch's default (dynamo) ONNX exporter needs it.
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "ruff>=0.5", "transformers>=5,<6",
                "onnxscript>=0.5"],
        # IREE: the einsum-kernel baseline of benchmarks/bench_tt.py (skipped when absent).
        # transformers, onnxscript: public architecture definitions exported by both of
        # PyTorch's exporters (alt_tvm.models.public: scripts/export_public.py, benchmarks/sweep_public.py).
        # OpenVINO: a CPU peer (alt_tvm.bench.openvino) of the benchmarks and the quick start.
        "bench": ["iree-base-compiler==3.13.0", "iree-base-runtime==3.13.0", "transformers>=5,<6",
                  "onnxscript>=0.5", "openvino==2026.4.1"],
    },
)
