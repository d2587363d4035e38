#!/bin/bash
# Pack what a GPU machine without a package index needs to run alt-tvm's GPU checks
# (docs/gpu.md, "How the software got there"). Run here, in the repository root:
#   bash benchmarks/gpu/pack.sh
# It writes two ignored folders, each under the 64 MiB that one device call carries:
#   .gpu/c  TVM's compiler library, xz-packed (about 59 MB; about 5 minutes on 2 cores)
#   .gpu/w  Python 3.12 wheels the GPU image lacks and TVM's Python package without the compiler
set -euo pipefail
PY=${PY:-.venv/bin/python}
SITE=$($PY -c "import os, tvm; print(os.path.dirname(os.path.dirname(tvm.__file__)))")
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
mkdir -p .gpu/c .gpu/w
version() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
# The versions installed here, so that the GPU machine runs what the tests ran here.
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/w \
    "apache-tvm-ffi==$(version apache-tvm-ffi)" "xgboost-cpu==$(version xgboost)" \
    "ortools==$(version ortools)" "protobuf==$(version protobuf)" "immutabledict==$(version immutabledict)"
tar -C "$SITE" --exclude='tvm/lib/libtvm_compiler.so' --exclude='tvm/3rdparty' --exclude='tvm/src' \
    --exclude='tvm/web' --exclude='__pycache__' -cJf .gpu/w/tvm_py.tar.xz tvm "apache_tvm-$(version apache-tvm).dist-info"
# A 192 MiB dictionary packs the 259 MB library into one call's allowance.
[ -s .gpu/c/libtvm_compiler.so.xz ] || \
    xz -9e --lzma2=preset=9e,dict=192MiB -c "$SITE/tvm/lib/libtvm_compiler.so" > .gpu/c/libtvm_compiler.so.xz
du -sh .gpu/c .gpu/w
