#!/usr/bin/env bash
# Prepare the emulated ARM board (emulated-arm64 in alt_tvm.target): an aarch64 Debian root with
# Python, NumPy and the aarch64 TVM wheel, run by qemu-user. Cached outside the checkout, in
# ${ALT_TVM_BOARD_CACHE:-$HOME/.cache/alt-tvm/boards}/arm64; a re-run with the same TVM versions
# is a no-op. Optional: on any failure it reports and exits 0, and the board tests skip.
#
# Nothing system-wide changes beyond the Debian packages it installs (qemu-user without its
# binfmt_misc registration, debootstrap): the root is never chrooted into; a host wrapper
# script runs its Python under qemu-aarch64 -L ROOT.
#
# Usage: .ci/prepare-board.sh [HOST_PYTHON]   (HOST_PYTHON: the venv whose TVM versions to
#        match; default .venv/bin/python). As root where apt-get and the network work.
set -u

HOST_PY="${1:-.venv/bin/python}"
CACHE="${ALT_TVM_BOARD_CACHE:-$HOME/.cache/alt-tvm/boards}"
DIR="$CACHE/arm64"
ROOT="$DIR/root"
WHEELS="$DIR/wheels"
STAMP="$DIR/READY"
MIRROR="${ALT_TVM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The board's CPU; matches the mcpu of emulated-arm64 so code built for any other CPU traps.
QEMU_CPU_NAME="cortex-a72"
SITE="usr/local/lib/python3.11/dist-packages"

skip() {
    echo "prepare-board: $1; the emulated-board tests will be skipped"
    exit 0
}

if ! PINS=$("$HOST_PY" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in
               ("apache-tvm", "apache-tvm-ffi", "numpy", "ml_dtypes", "typing_extensions",
                "cloudpickle", "psutil", "tornado")))
EOF
); then
    skip "cannot read the TVM versions of $HOST_PY"
fi
WANT="$PINS cpu=$QEMU_CPU_NAME"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    echo "prepare-board: emulated arm64 board ready in $DIR"
    exit 0
fi

QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
if [ -z "$QEMU" ] || ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u 2>/dev/null || echo unknown)" != 0 ]; then
        skip "qemu-aarch64 or debootstrap missing and not running as root"
    fi
    command -v apt-get >/dev/null 2>&1 || skip "apt-get not found"
    export DEBIAN_FRONTEND=noninteractive
    APT_OPTS="-o Acquire::Retries=1 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30"
    apt-get $APT_OPTS update -qq || skip "apt-get update failed"
    # --no-install-recommends: keeps qemu-user-binfmt (a system-wide binfmt_misc handler) out.
    apt-get $APT_OPTS install -y -qq --no-install-recommends qemu-user debootstrap >/dev/null ||
        skip "apt-get install qemu-user debootstrap failed"
    QEMU=$(command -v qemu-aarch64 || true)
    [ -n "$QEMU" ] || skip "qemu-user installed but qemu-aarch64 is missing"
fi

mkdir -p "$DIR" || skip "cannot create $DIR"
rm -f "$STAMP"

# The Debian root: debootstrap's first stage resolves and downloads the packages; they are
# unpacked here with dpkg-deb instead of its second stage (which would run the maintainer
# scripts under emulation for minutes and needs binfmt_misc). Python runs without them.
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    [ "$(id -u 2>/dev/null || echo unknown)" = 0 ] || skip "debootstrap needs root"
    rm -rf "$ROOT"
    debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,libstdc++6 \
        bookworm "$ROOT" "$MIRROR" >"$DIR/debootstrap.log" 2>&1 ||
        skip "debootstrap failed (see $DIR/debootstrap.log)"
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$deb" "$ROOT" || skip "cannot unpack $deb"
    done
    [ -x "$ROOT/usr/bin/python3.11" ] || skip "the root has no python3.11"
fi

# The aarch64 wheels of the versions the host runs, unpacked into the root's site directory.
mkdir -p "$WHEELS"
# shellcheck disable=SC2086 # PINS is a list of requirements
"$HOST_PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
    --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 \
    -d "$WHEELS" $PINS || skip "pip download of the aarch64 wheels failed"
rm -rf "${ROOT:?}/$SITE"
mkdir -p "$ROOT/$SITE"
"$HOST_PY" - "$ROOT/$SITE" "$WHEELS" $PINS <<'EOF' || skip "cannot unpack the wheels"
import re, sys, zipfile
from pathlib import Path
site, wheels, pins = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
for pin in pins:
    name, ver = pin.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower() + "-" + ver + "-"
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(stem)]
    if not found:
        sys.exit(f"no wheel for {pin} in {wheels}")
    with zipfile.ZipFile(found[0]) as z:
        for info in z.infolist():
            path = z.extract(info, site)
            mode = info.external_attr >> 16
            if mode:
                Path(path).chmod(mode & 0o777)
EOF
# Bytecode compiled here, by the host's Python 3.11 (the same bytecode): under qemu -L the
# board's Python cannot create __pycache__ directories (a new path resolves on the host), and
# without bytecode every emulated `import tvm` compiles TVM again (41 s instead of 23 s).
if "$HOST_PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    "$HOST_PY" -m compileall -q -j 0 -s "$ROOT" -p / "$ROOT/usr/lib/python3.11" "$ROOT/$SITE" >/dev/null 2>&1 ||
        true  # a file that does not compile (a test of a package) is compiled on import, as without this
fi
# Child processes (the RPC server's popen workers) re-run sys.executable: the host wrapper.
echo 'import os, sys; sys.executable = os.environ.get("ALT_TVM_BOARD_PYTHON") or sys.executable' \
    >"$ROOT/$SITE/alt_tvm_board.pth"

# The host wrapper: the board's Python under qemu-aarch64, with a clean Python environment.
cat >"$DIR/python" <<EOF
#!/bin/sh
# Python of the emulated aarch64 board ($QEMU_CPU_NAME under qemu-user), root $ROOT.
export ALT_TVM_BOARD_PYTHON="$DIR/python"
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP VIRTUAL_ENV
exec "$QEMU" -cpu $QEMU_CPU_NAME -L "$ROOT" "$ROOT/usr/bin/python3.11" "\$@"
EOF
chmod +x "$DIR/python"

if ! OUT=$("$DIR/python" -c "import numpy, tvm, tvm.rpc, platform; print(platform.machine(), tvm.__version__)" 2>&1); then
    echo "$OUT" | tail -5
    skip "the board's Python cannot import TVM"
fi
echo "prepare-board: board Python says: $OUT"
echo "$WANT" >"$STAMP"
echo "prepare-board: emulated arm64 board ready in $DIR"
exit 0
