#!/usr/bin/env bash
# Make the kit that the device check carries to a bare CUDA machine (no network,
# no package manager, no MPI, OpenBLAS or jansson there): the Debian 12 packages of
# MPICH (with its launcher), OpenBLAS, jansson and the libraries they load at run
# time that a bare Ubuntu 24.04 CUDA image lacks, unpacked, pruned of what neither
# the build nor the runs use, and packed into one file:
#
#   bash tests/gpu/make-kit.sh          (from the repository root, on Debian 12)
#
# writes gpu-kit/kit.tar.xz and gpu-kit/PACKAGES (ignored by git), and prints the
# kit's size beside the working tree's: the device machine takes at most 64 MiB
# of the two together. tests/gpu/kit-setup.sh unpacks it there.
# Knobs (environment): KIT_DIR [gpu-kit]. Exit 0 made, 1 failed, 77 when
# apt-get download cannot fetch (no Debian, no network: the rehearsal's skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT_DIR=${KIT_DIR:-gpu-kit}

# What the build and the runs load, by Debian package (bookworm names). The newest
# glibc symbol among them is 2.34 (Ubuntu 24.04 has 2.39): the reason the kit comes
# from Debian 12, not from a newer release.
PACKAGES=(
  mpich libmpich12 libmpich-dev                      # mpicc, mpiexec.hydra, libmpich
  libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libopenblas0
  libjansson4 libjansson-dev
  libhwloc15 libucx0 libslurm38                      # what libmpich12 loads
  libgfortran5 libquadmath0                          # what libopenblas loads
  libudev1 libnuma1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200   # and what those load
)

command -v apt-get >/dev/null && command -v dpkg >/dev/null || { echo "make-kit: needs apt-get and dpkg (Debian)"; exit 77; }
if ! grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  echo "make-kit: WARNING: not Debian 12 (bookworm): the packages' glibc may be newer than the GPU machine's"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/pl-kit-make.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
echo "make-kit: apt-get download of ${#PACKAGES[@]} packages"
if ! (cd "$work/debs" && apt-get download -q "${PACKAGES[@]}" >"$work/download.log" 2>&1); then
  tail -n 5 "$work/download.log"
  echo "make-kit: apt-get download failed (no network or no Debian archive here)"
  exit 77
fi
echo "make-kit: $(ls "$work/debs" | wc -l) .debs, $(du -sh "$work/debs" | cut -f1)"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done

# usrmerge: some packages still ship /lib; one tree under usr/ is what kit-setup expects
r=${work:?}/root
if [ -d "$r/lib" ]; then cp -a "$r/lib/." "$r/usr/lib/" && rm -rf "${r:?}/lib"; fi
# Pruned: static archives (the build links shared), documentation, Fortran and C++
# bindings, the reference BLAS/LAPACK front ends (libopenblas carries LAPACK itself),
# rsocket's preload library, man pages.
a=$r/usr/lib/x86_64-linux-gnu
find "$r" -name '*.a' -delete
rm -rf "${r:?}/usr/share" "${r:?}/etc" "$a/rsocket" "$a/openblas-pthread/libblas"* "$a/openblas-pthread/liblapack"*
rm -f "$a"/libmpichfort* "$a"/libmpichcxx* "$r"/usr/bin/mpif* "$r"/usr/bin/mpicxx* "$r"/usr/bin/mpifort*
find "$r/usr/include" -name '*.mod' -delete 2>/dev/null || true
# the dangling links the pruning left
find "$r" -xtype l -delete

mkdir -p "$KIT_DIR"
tar -C "$r" -cf - usr | xz -T0 >"$KIT_DIR/kit.tar.xz.tmp"
mv "$KIT_DIR/kit.tar.xz.tmp" "$KIT_DIR/kit.tar.xz"
for deb in "$work"/debs/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' '; done |
  sed 's/Package: //; s/Version: //' >"$KIT_DIR/PACKAGES"

kit_bytes=$(du -cb "$KIT_DIR"/kit.tar.xz "$KIT_DIR"/PACKAGES | tail -n 1 | cut -f1)
unpacked=$(du -sb "$r" | cut -f1)
# what the device machine's copy carries: tracked files and untracked files git does not ignore
tree_bytes=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "make-kit: $KIT_DIR/kit.tar.xz: $(mib "$kit_bytes") ($(mib "$unpacked") unpacked)"
echo "make-kit: working tree $(mib "$tree_bytes") + kit $(mib "$kit_bytes") = $(mib $((tree_bytes + kit_bytes))) of the 64 MiB that travel"
if [ $((tree_bytes + kit_bytes)) -gt $((56 * 1048576)) ]; then
  echo "make-kit: FAILED: tree + kit over 56 MiB (the limit is 64 MiB: keep a margin)"
  exit 1
fi
