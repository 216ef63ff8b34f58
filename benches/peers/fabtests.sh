#!/usr/bin/env bash
# Builds libfabric's own benchmarks (fabtests: fi_rma_bw, fi_rdm_pingpong, fi_msg_pingpong, ...)
# for one libfabric, so that benches/scripts/compare_hosts.py can measure libfabric's ceiling
# next to ampccl's ofi provider. Debian packages no fabtests; they come from the libfabric source
# of the same version, built against the libfabric that ampccl and Intel MPI run on.
#
#   benches/peers/fabtests.sh                     2.4.0 against Intel MPI's libfabric
#                                                 ($PEERS_HOME/impi/lib, benches/peers/install.sh)
#   benches/peers/fabtests.sh --version 1.17.1    1.17.1 against the system's libfabric (1.17)
#
# Options:
#   --version V          libfabric release whose fabtests (and include/rdma headers) are built
#                        (default 2.4.0, the libfabric Intel MPI bundles)
#   --libfabric-dir DIR  the directory of the libfabric.so.1 to link against and run on (default:
#                        $PEERS_HOME/impi/lib for 2.4.0, else the system's library)
#   --src DIR            a libfabric source tree (with fabtests/ and include/) or a git mirror of
#                        libfabric (tag vV is read); default: the release tarball from GitHub
#
# Installs the benchmarks into $PEERS_HOME/fabtests-V/bin (PEERS_HOME default
# ~/.cache/ampccl-peers), with an rpath to the libfabric directory; the 2.4.0 build still needs
# FI_PROVIDER_PATH=<that directory> at run time (Intel MPI's tcp provider is a plugin there).
# A build that is already in place is kept. Installs autoconf, automake and libtool with apt when
# they are missing (a git source has no configure script).
set -euo pipefail

home=${PEERS_HOME:-$HOME/.cache/ampccl-peers}
version=2.4.0 src= libdir=
while [ $# -gt 0 ]; do
  case $1 in
    --version) version=$2; shift 2 ;;
    --src) src=$2; shift 2 ;;
    --libfabric-dir) libdir=$2; shift 2 ;;
    *) echo "usage: $0 [--src DIR_OR_GIT_MIRROR] [--version V] [--libfabric-dir DIR]" >&2; exit 2 ;;
  esac
done
if [ -z "$libdir" ]; then
  if [ "$version" = 2.4.0 ]; then
    libdir=$home/impi/lib
  else
    libdir=$(dirname "$(ldconfig -p | awk '/libfabric\.so\.1 / { print $NF; exit }')")
  fi
fi
prefix=$home/fabtests-$version
if [ -x "$prefix/bin/fi_rma_bw" ]; then
  echo "fabtests $version: already installed in $prefix/bin"
  exit 0
fi
[ -e "$libdir/libfabric.so.1" ] || { echo "no libfabric.so.1 in $libdir" >&2; exit 1; }

need=(make gcc)
[ -n "$src" ] && ! [ -x "$src/fabtests/configure" ] && need+=(autoreconf libtoolize)
for p in "${need[@]}"; do
  if ! command -v "$p" >/dev/null; then
    apt-get install -y -q build-essential autoconf automake libtool >/dev/null
    break
  fi
done

# The source: fabtests/ and include/rdma/ of libfabric $version, in $build.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
if [ -z "$src" ]; then
  url=https://github.com/ofiwg/libfabric/releases/download/v$version/libfabric-$version.tar.bz2
  curl -fsSL "$url" | tar -xj -C "$build" --strip-components=1
elif git --git-dir="$src" rev-parse -q --verify "v$version^{commit}" >/dev/null 2>&1; then
  git --git-dir="$src" archive "v$version" fabtests include | tar -x -C "$build"
else
  cp -r "$src/fabtests" "$src/include" "$build/"
fi

# --with-libfabric wants DIR/include and DIR/lib: the version's public headers (only rdma/: the
# internal ones of include/ would shadow fabtests' own) and a libfabric.so to link against, a link
# to the library's libfabric.so.1 (Debian's libfabric1 package ships no libfabric.so).
mkdir -p "$build/libfabric/include" "$build/libfabric/lib"
ln -s "$build/include/rdma" "$build/libfabric/include/rdma"
ln -s "$(realpath "$libdir/libfabric.so.1")" "$build/libfabric/lib/libfabric.so"
ln -s "$(realpath "$libdir/libfabric.so.1")" "$build/libfabric/lib/libfabric.so.1"
cd "$build/fabtests"
[ -x configure ] || ./autogen.sh >autogen.log 2>&1 || { cat autogen.log >&2; exit 1; }
./configure -q --prefix="$prefix" --with-libfabric="$build/libfabric" \
  LDFLAGS="-Wl,-rpath,$(realpath "$libdir")"
# Only the benchmarks (the functional and unit tests are not needed here).
progs=$(grep -o 'benchmarks/fi_[a-z_]*' Makefile.am | sort -u)
make -s -j"$(nproc)" $progs >/dev/null
mkdir -p "$prefix/bin"
for p in $progs; do ./libtool --mode=install install -m 755 "$p" "$prefix/bin/" >/dev/null; done
echo "fabtests $version (libfabric in $libdir) installed in $prefix/bin:"
ls "$prefix/bin"
