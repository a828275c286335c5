#!/bin/sh
# Builds Lua Torch7 into $PREFIX from the pinned source archives in $1, in parts:
#   lua      (the default) LuaJIT 2.1 and luarocks (torch/luajit-rocks), then
#            `luarocks make` of each rock in the order of torch/distro's install.sh,
#            with the rockspec it names;
#   cutorch, cunn  (the GPU image, after lua) the CUDA packages, as distro's
#            install.sh builds them, with the changes CUDA 11 needs: the
#            cuda11-<part>.patch files in $PATCHES (default: beside this script) and
#            the lines below.  $TORCH_CUDA_ARCH_LIST names the GPU code to generate.
# One part a call, so that each can be its own image layer.
set -eu
SOURCES=$1
PART=${2:-lua}
PREFIX=${PREFIX:-/opt/torch}
PATCHES=${PATCHES:-$(dirname "$0")}
JOBS=${JOBS:-$(nproc)}
WORK=$(mktemp -d)

unpack() {  # unpack <archive stem>: extract $SOURCES/<stem>-*.tar.gz, print its folder
    archive=$(ls "$SOURCES"/"$1"-*.tar.gz)
    tar -xzf "$archive" -C "$WORK"
    echo "$WORK/$(basename "$archive" .tar.gz)"
}

rocks() {  # rocks: stem rockspec, a line each, made in that order
    while read -r stem rockspec; do
        dir=$(unpack "$stem")
        echo "luarocks make $stem $rockspec"
        (cd "$dir" && MAKEFLAGS=-j"$JOBS" "$PREFIX/bin/luarocks" make "$rockspec" >/dev/null)
    done
}

case $PART in
lua)
    # LuaJIT is made by one make at a time: its CMake lists the headers buildvm generates
    # (lj_folddef.h and the others) in three targets (the shared and static libraries, the
    # executable), so a parallel make may write one of them while another target compiles
    # the amalgamation against it ("'fold_hash' undeclared": seen once, in a cold build).
    # It is one translation unit, so parallelism gained little.
    dir=$(unpack luajit-rocks)
    mkdir "$dir/build"
    (cd "$dir/build" \
        && cmake .. -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_BUILD_TYPE=Release -DWITH_LUAJIT21=ON >/dev/null \
        && make install >/dev/null)
    rocks <<ROCKS
luafilesystem rockspecs/luafilesystem-1.6.3-1.rockspec
Penlight penlight-scm-1.rockspec
lua-cjson lua-cjson-2.1devel-1.rockspec
luaffifb luaffi-scm-1.rockspec
sundown-ffi rocks/sundown-scm-1.rockspec
cwrap rocks/cwrap-scm-1.rockspec
paths rocks/paths-scm-1.rockspec
torch7 rocks/torch-scm-1.rockspec
dok rocks/dok-scm-1.rockspec
trepl trepl-scm-1.rockspec
sys sys-1.1-0.rockspec
xlua xlua-1.1-0.rockspec
Moses rockspec/moses-1.6.1-1.rockspec
nn rocks/nn-scm-1.rockspec
image image-1.1.alpha-0.rockspec
optim optim-1.0.5-0.rockspec
lua---nnx nnx-0.1-1.rockspec
ROCKS
    ;;
cutorch|cunn)
    # cuda_fp16.h's own half operators (CUDA 9.2 and later) make every half comparison
    # ambiguous beside THC's: THC keeps its own, as it had them before.  (The rockspecs'
    # CMake files read TORCH_NVCC_FLAGS and TORCH_CUDA_ARCH_LIST.)
    export TORCH_NVCC_FLAGS="-D__CUDA_NO_HALF_OPERATORS__"
    dir=$(unpack "$PART")
    (cd "$dir" && patch -p1 <"$PATCHES/cuda11-$PART.patch")
    if [ "$PART" = cunn ]; then
        # SparseLinear's CUDA code calls cuSPARSE's csrmm, which CUDA 11 removed: it is
        # left out, so nn.SparseLinear has no CUDA version (GTDLBench's scripts do not use it).
        rm "$dir/lib/THCUNN/SparseLinear.cu" "$dir/lib/THCUNN/generic/SparseLinear.cu"
    fi
    echo "luarocks make $PART rocks/$PART-scm-1.rockspec (GPU code: ${TORCH_CUDA_ARCH_LIST:-?})"
    (cd "$dir" && "$PREFIX/bin/luarocks" make "rocks/$PART-scm-1.rockspec" >/dev/null)
    ;;
*)
    echo "build-torch7.sh: unknown part $PART (lua, cutorch or cunn)" >&2
    exit 2
    ;;
esac
rm -rf "$WORK" "$HOME/.cache/luarocks"
if [ "$PART" = lua ]; then
    "$PREFIX/bin/th" -e "require 'nn'; require 'nnx'; require 'optim'; require 'image'; require 'pl'"
fi
