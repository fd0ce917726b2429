#!/usr/bin/env bash
# The rehearsal of the device check, on any Debian machine (root): in a mount
# namespace the host's MPICH, OpenBLAS, jansson, hwloc, UCX and the other
# libraries of the kit are hidden (an empty, unreadable file over each of their
# files), and so is the CUDA toolkit's NCCL, which reappears as the pip package
# nvidia-nccl-cu13 ships it (a lone libnccl.so.2 and nccl.h under
# site-packages/nvidia/nccl). Then, as on the GPU machine,
#
#   source tests/gpu/kit-setup.sh && bash tests/gpu/device-check.sh --rehearse
#
# configures with CUDA on (sm_90), builds the targets its runs need, and runs the
# CPU runs of the plan; a missing library or a wrong path fails here, not in the
# GPU slot. It then checks what would come back: at most 8 files, the verdict,
# and that lab01_dp loads MPI, OpenBLAS and jansson from the kit and NCCL from the
# pip-style folder. Prints the size of the working tree and the kit.
#
#   bash tests/gpu/rehearse.sh        exit 0 passed, 1 failed, 77 skipped (why: printed)
# Knobs: KIT_DIR [gpu-kit] (made by make-kit.sh when missing), REHEARSE_DIR [a
# temporary folder: the kit's prefix, the build, OUT], KEEP=1 keeps it, STEPS [3],
# HARD_END [780: the build on 2 shared cores is slower than on the GPU machine's 16].
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$(pwd)
KIT_DIR=${KIT_DIR:-gpu-kit}
# what is hidden: the kit's packages and what the GPU machine lacks besides, as installed here
HIDE=(mpich libmpich12 libmpich-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libopenblas0
      libopenblas0-openmp libopenblas-openmp-dev libblas3 liblapack3 libjansson4 libjansson-dev
      libhwloc15 libhwloc-plugins libucx0 libslurm38 libgfortran5 libquadmath0 libnuma1 libibverbs1
      librdmacm1 libnl-3-200 libnl-route-3-200 ibverbs-providers
      libdnnl-dev libdnnl2)   # optional here, absent there: the CPU's bf16 then widens to sgemm

skip() { echo "rehearse: SKIPPED: $*"; exit 77; }
fail() { echo "rehearse: FAILED: $*"; exit 1; }

if [ "${1:-}" != "--inside" ]; then
    [ "$(id -u)" = 0 ] || skip "needs root (a mount namespace with bind mounts)"
    command -v unshare >/dev/null || skip "no unshare (util-linux)"
    unshare -m --propagation private true 2>/dev/null || skip "mount namespaces are not allowed here"
    command -v dpkg-query >/dev/null || skip "not a Debian machine (dpkg-query)"
    if [ ! -f "$KIT_DIR/kit.tar.xz" ]; then
        KIT_DIR=$KIT_DIR bash tests/gpu/make-kit.sh
        rc=$?
        [ $rc = 77 ] && skip "no kit and apt-get download cannot make one here"
        [ $rc = 0 ] || fail "make-kit.sh"
    fi
    exec unshare -m --propagation private bash "$0" --inside
fi

# ---- inside the namespace ------------------------------------------------------
DIR=${REHEARSE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pl-rehearse.XXXXXX")}
# (the bind-mounted NCCL first: rm cannot remove a mount point)
[ "${KEEP:-0}" = 1 ] || trap 'umount "$DIR/site/nvidia/nccl/lib/libnccl.so.2" 2>/dev/null; rm -rf "$DIR"' EXIT
mkdir -p "$DIR"
hidden=$DIR/hidden
: >"$hidden" && chmod 000 "$hidden"
hide() { mount --bind "$hidden" "$1" || fail "cannot hide $1"; }

n=0
for pkg in "${HIDE[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || continue
    while IFS= read -r f; do
        if [ -f "$f" ] && [ ! -L "$f" ]; then hide "$f"; n=$((n + 1)); fi
    done < <(dpkg-query -L "$pkg")
done
echo "rehearse: hid $n files of the host's MPICH, OpenBLAS, jansson and what they load"

# the toolkit's NCCL becomes the pip package's layout: site/nvidia/nccl/{lib/libnccl.so.2,include}
CUDA=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
SITE=$DIR/site
if ls "$CUDA"/lib*/libnccl.so.2 >/dev/null 2>&1; then
    pip_nccl=$SITE/nvidia/nccl
    mkdir -p "$pip_nccl/lib" "$pip_nccl/include"
    real=$(readlink -f "$(ls "$CUDA"/lib*/libnccl.so.2 | head -n 1)")
    : >"$pip_nccl/lib/libnccl.so.2" && mount --bind "$real" "$pip_nccl/lib/libnccl.so.2"
    cp -r "$CUDA"/include/nccl*.h "$pip_nccl/include/"
    [ -d "$CUDA/include/nccl_device" ] && cp -r "$CUDA/include/nccl_device" "$pip_nccl/include/"
    while IFS= read -r f; do
        f=$(readlink -f "$f"); [ -f "$f" ] && [ -s "$f" ] && hide "$f"
    done < <(find -L "$CUDA"/ "$CUDA"/targets/*/ -maxdepth 3 \( -name 'libnccl*' -o -name 'nccl.h' \) 2>/dev/null)
    echo "rehearse: the toolkit's NCCL hidden; a lone libnccl.so.2 in $pip_nccl (as pip's nvidia-nccl-cu13)"
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi

# proof that the host's copies are gone
if mpicc -show >/dev/null 2>&1; then fail "the host's mpicc still works: MPICH is not hidden"; fi
for lib in libmpich.so.12 libopenblas.so.0 libjansson.so.4 libucp.so.0 libhwloc.so.15; do
    path=$(ldconfig -p | awk -v n="$lib" '$1 == n { print $NF; exit }')
    [ -z "$path" ] || [ ! -s "$(readlink -f "$path")" ] || fail "the host's $lib ($path) is still readable"
done

# ---- as on the GPU machine -----------------------------------------------------
export PL_KIT="$REPO/$KIT_DIR/kit.tar.xz" PL_KIT_PREFIX=$DIR/kit
# shellcheck source=kit-setup.sh
source tests/gpu/kit-setup.sh || fail "kit-setup.sh"
if [ -n "${pip_nccl:-}" ] && [ "${PL_NCCL_ROOT:-}" != "$pip_nccl" ]; then
    fail "kit-setup.sh found NCCL at '${PL_NCCL_ROOT:-}', not in the pip package's folder $pip_nccl"
fi
# a shared 2-core CI machine builds slower than the GPU machine's 16 cores: a later hard end
export BUILD=$DIR/build OUT=$DIR/out WORK=$DIR/work STEPS=${STEPS:-3} HARD_END=${HARD_END:-780}
# A hidden file still exists for CMake's find_library: oneDNN (optional, and absent
# there) is turned off rather than found empty.
export PL_CMAKE_ARGS="-DPL_ONEDNN=OFF"
bash tests/gpu/device-check.sh --rehearse
rc=$?

# ---- what would come back ------------------------------------------------------
echo
echo "rehearse: OUT holds: $(cd "$OUT" && ls | tr '\n' ' ')"
files=$(find "$OUT" -type f | wc -l)
[ "$files" -le 8 ] || fail "$files files in OUT (at most 8 come back)"
tar tzf "$OUT/logs.tar.gz" >"$DIR/archive.txt"  # (grep -q on a pipe would stop tar: pipefail)
grep -q 'logs/lab01_cpu_n1.log' "$DIR/archive.txt" || fail "logs.tar.gz lacks the runs' logs"
grep -q 'all device checks passed' "$OUT/summary.md" || fail "the summary's verdict is not a pass"
ldd "$BUILD/lab01_dp" >"$DIR/ldd.txt"
for lib in libmpich libopenblas libjansson; do
    grep -q "$lib.* => $PL_KIT_PREFIX/" "$DIR/ldd.txt" || fail "lab01_dp does not load $lib from the kit: $(grep "$lib" "$DIR/ldd.txt")"
done
if [ -n "${pip_nccl:-}" ]; then
    grep -q "libnccl.* => $pip_nccl/" "$DIR/ldd.txt" || fail "lab01_dp does not load NCCL from the pip folder: $(grep libnccl "$DIR/ldd.txt")"
fi
sed 's/^/  /' "$DIR/ldd.txt" | grep -E 'mpich|openblas|jansson|nccl|cublas'
[ $rc = 0 ] || fail "device-check.sh --rehearse exit $rc"

kit=$(du -cb "$REPO/$KIT_DIR"/* | tail -n 1 | cut -f1)
tree=$(cd "$REPO" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
awk -v t="$tree" -v k="$kit" 'BEGIN { printf "rehearse: working tree %.1f MiB + kit %.1f MiB = %.1f MiB of the 64 MiB that travel\n", t / 1048576, k / 1048576, (t + k) / 1048576 }'
echo "rehearse: passed"
