# shellcheck shell=bash
# Source this on the GPU machine, from the repository root, before the device check:
#
#   source tests/gpu/kit-setup.sh && bash tests/gpu/device-check.sh
#
# It unpacks the kit that tests/gpu/make-kit.sh made (gpu-kit/kit.tar.xz: MPICH,
# OpenBLAS, jansson and what they load, from Debian 12) into a prefix, does there
# what Debian's maintainer scripts would have done (the links mpirun, mpiexec,
# mpicc, libopenblas.so; the install paths written into the mpicc wrapper), sets
# aside every kit library the machine has a copy of already (its own is newer),
# and exports PATH, LD_LIBRARY_PATH and CMAKE_PREFIX_PATH. It finds NCCL in the
# CUDA toolkit or in the pip package nvidia-nccl-cu* (a lone libnccl.so.2 and
# nccl.h: exported as PL_NCCL_ROOT, which the top CMakeLists.txt reads), and picks
# Ninja when there is no make. Knobs: PL_KIT [gpu-kit/kit.tar.xz], PL_KIT_PREFIX
# [${TMPDIR:-/tmp}/pl-kit], PL_NCCL_ROOT (a folder with lib/ and include/) to choose NCCL.
# Returns non-zero, having said why, when the kit is missing or does not unpack.

_plkit_say() { printf 'kit-setup: %s\n' "$*"; }

_plkit_unpack() { # KIT PREFIX: unpack and make the links, once per kit file
    local kit=$1 prefix=$2 id
    id=$(stat -c '%s %Y' "$kit")
    if [ -f "$prefix/.kit-id" ] && [ "$(cat "$prefix/.kit-id")" = "$id" ]; then
        return 0
    fi
    rm -rf "$prefix" && mkdir -p "$prefix" || return 1
    if command -v xz >/dev/null; then
        tar -C "$prefix" -xJf "$kit"
    else  # no xz-utils: Python's tarfile reads xz itself
        python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extractall(sys.argv[2], **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))' "$kit" "$prefix"
    fi || { _plkit_say "cannot unpack $kit"; return 1; }
    local bin=$prefix/usr/bin lib=$prefix/usr/lib/x86_64-linux-gnu
    # the links of Debian's alternatives and maintainer scripts
    ln -sf mpiexec.hydra "$bin/mpiexec"
    ln -sf mpiexec.hydra "$bin/mpirun"
    ln -sf mpicc.mpich "$bin/mpicc"
    ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
    ln -sf openblas-pthread/libopenblas.so "$lib/libopenblas.so"
    # mpicc is a script with Debian's install paths written in: point them here
    sed -i -e "s|^prefix=/usr\$|prefix=$prefix/usr|" -e "s|^exec_prefix=/usr\$|exec_prefix=$prefix/usr|" \
        -e "s|^includedir=/usr/|includedir=$prefix/usr/|" -e "s|^libdir=/usr/|libdir=$prefix/usr/|" \
        -e "s|-L/usr/lib|-L$lib|g" "$bin/mpicc.mpich"
    # A library the machine has already (a non-empty file under the soname that
    # ldconfig knows) is set aside: the machine's copy is the newer one, and what
    # else runs here was built against it.
    local ldc name path
    ldc=$(command -v ldconfig || echo /sbin/ldconfig)
    mkdir -p "$lib/machine-has-these"
    local so
    for so in "$lib"/*.so.*; do
        name=${so##*/}
        [[ $name =~ \.so\.[0-9]+$ ]] || continue  # the sonames, not the files they point to
        path=$("$ldc" -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
        if [ -n "$path" ] && [ -s "$(readlink -f "$path")" ]; then
            mv "$so" "$lib/machine-has-these/"
        fi
    done
    echo "$id" >"$prefix/.kit-id"
}

_plkit_nccl() { # prints the folder holding lib/libnccl.so* and include/nccl.h, or nothing
    local cuda=$1 d
    if [ -n "${PL_NCCL_ROOT:-}" ]; then echo "$PL_NCCL_ROOT"; return; fi
    local so
    for d in "$cuda" "$cuda/targets/x86_64-linux"; do
        for so in "$d"/lib*/libnccl.so*; do  # a file with something in it
            if [ -s "$(readlink -f "$so")" ] && [ -s "$d/include/nccl.h" ]; then
                echo "$d"; return
            fi
        done
    done
    # the pip package (nvidia-nccl-cu12 / -cu13): site-packages/nvidia/.../lib/libnccl.so.2
    python3 - 2>/dev/null <<'EOF'
import glob, os, site, sys
roots = list(dict.fromkeys(sys.path + site.getsitepackages() + [site.getusersitepackages()]))
for root in roots:
    for so in sorted(glob.glob(os.path.join(root, "nvidia", "**", "libnccl.so*"), recursive=True)):
        top = os.path.dirname(os.path.dirname(so))
        if os.path.exists(os.path.join(top, "include", "nccl.h")):
            print(top)
            sys.exit(0)
EOF
}

_plkit_main() {
    local repo kit prefix cuda nccl lib
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    kit=${PL_KIT:-$repo/gpu-kit/kit.tar.xz}
    prefix=${PL_KIT_PREFIX:-${TMPDIR:-/tmp}/pl-kit}
    if [ ! -f "$kit" ]; then
        _plkit_say "no kit at $kit: make it first on Debian 12 with bash tests/gpu/make-kit.sh"
        return 1
    fi
    _plkit_unpack "$kit" "$prefix" || return 1
    lib=$prefix/usr/lib/x86_64-linux-gnu
    export PATH="$prefix/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export PL_KIT_PREFIX=$prefix

    cuda=/usr/local/cuda
    command -v nvcc >/dev/null && cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    if ! command -v nvcc >/dev/null && [ -x "$cuda/bin/nvcc" ]; then export PATH="$PATH:$cuda/bin"; fi
    nccl=$(_plkit_nccl "$cuda")
    if [ -n "$nccl" ]; then
        export PL_NCCL_ROOT=$nccl
        case ":$LD_LIBRARY_PATH:" in *":$nccl/lib:"*) ;; *) export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl/lib" ;; esac
    fi
    if ! command -v make >/dev/null && command -v ninja >/dev/null; then export CMAKE_GENERATOR=Ninja; fi

    _plkit_say "prefix $prefix ($(du -sh "$prefix" 2>/dev/null | cut -f1)); set aside (the machine has them): $(ls "$lib/machine-has-these" | tr '\n' ' ')"
    _plkit_say "mpicc $(command -v mpicc) | mpiexec $(command -v mpiexec) | $(mpichversion 2>/dev/null | head -n 1)"
    _plkit_say "OpenBLAS $(readlink -f "$lib/libopenblas.so") | jansson $(ls "$lib"/libjansson.so* 2>/dev/null | head -n 1)"
    _plkit_say "NCCL ${nccl:-NOT FOUND (toolkit or pip nvidia-nccl-cu*)}: $(ls "${nccl:-/nonexistent}"/lib*/libnccl.so* 2>/dev/null | tr '\n' ' ')"
    _plkit_say "cuBLAS $(ls "$cuda"/lib64/libcublas.so.* "$cuda"/targets/*/lib/libcublas.so.* 2>/dev/null | head -n 1) | nvcc $(command -v nvcc || echo 'not on PATH') | generator ${CMAKE_GENERATOR:-default (make)}"
}

_plkit_main
_plkit_rc=$?
unset -f _plkit_say _plkit_unpack _plkit_nccl _plkit_main
# shellcheck disable=SC2317
return $_plkit_rc 2>/dev/null || exit $_plkit_rc
