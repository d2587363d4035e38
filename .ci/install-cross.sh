#!/usr/bin/env bash
# Install the Debian cross compilers that alt_tvm.tuning.measure uses to export kernels for
# the ARM (kirin990) and RISC-V (bananapi-f3) boards. Optional: without them the
# cross-compilation tests are skipped, so this script never fails the CI.
#
# Usage: .ci/install-cross.sh   (as root where apt-get works; otherwise it only reports)
set -u

# The libc6-dev-*-cross packages are only "recommended" by the gcc ones, but linking a shared
# object needs their crti.o / libc stubs.
PACKAGES="gcc-aarch64-linux-gnu gcc-riscv64-linux-gnu libc6-dev-arm64-cross libc6-dev-riscv64-cross"
COMPILERS="aarch64-linux-gnu-gcc riscv64-linux-gnu-gcc"

# True when every cross compiler exists and links a shared object (which needs its libc dev files).
have_all() {
    tmp=$(mktemp -d 2>/dev/null) || return 1
    for cc in $COMPILERS; do
        if ! command -v "$cc" >/dev/null 2>&1 ||
           ! echo 'int f(void) { return 0; }' | "$cc" -x c -shared -fPIC -o "$tmp/t.so" - >/dev/null 2>&1; then
            rm -rf "$tmp"
            return 1
        fi
    done
    rm -rf "$tmp"
    return 0
}

skip() {
    echo "install-cross: $1; cross-compilation tests will be skipped" \
         "(install with: apt-get install $PACKAGES)"
    exit 0
}

if have_all; then
    echo "install-cross: cross compilers already installed ($COMPILERS)"
    exit 0
fi
if [ "$(id -u 2>/dev/null || echo unknown)" != 0 ]; then
    skip "not running as root"
fi
if ! command -v apt-get >/dev/null 2>&1; then
    skip "apt-get not found"
fi

export DEBIAN_FRONTEND=noninteractive
# Short network timeouts: an offline runner should report and move on, not stall the job.
APT_OPTS="-o Acquire::Retries=1 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30"
if ! apt-get $APT_OPTS update -qq; then
    skip "apt-get update failed"
fi
# --no-install-recommends: the other recommended extras (docs, manpages) are not needed to link.
if ! apt-get $APT_OPTS install -y -qq --no-install-recommends $PACKAGES; then
    skip "apt-get install failed"
fi
if have_all; then
    echo "install-cross: installed $PACKAGES"
else
    skip "packages installed but a cross compiler is missing or cannot link a shared object"
fi
exit 0
