#!/bin/sh
# Builds Lua Torch7 into $PREFIX from the pinned source archives in $1:
# LuaJIT 2.1 and luarocks (torch/luajit-rocks), then `luarocks make` of each
# rock in the order of torch/distro's install.sh, with the rockspec it names.
set -eu
SOURCES=$1
PREFIX=${PREFIX:-/opt/torch}
JOBS=${JOBS:-$(nproc)}
WORK=$(mktemp -d)

unpack() {  # unpack <archive stem>: extract $SOURCES/<stem>-*.tar.gz, print its folder
    archive=$(ls "$SOURCES"/"$1"-*.tar.gz)
    tar -xzf "$archive" -C "$WORK"
    echo "$WORK/$(basename "$archive" .tar.gz)"
}

dir=$(unpack luajit-rocks)
mkdir "$dir/build"
cd "$dir/build"
cmake .. -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_BUILD_TYPE=Release -DWITH_LUAJIT21=ON >/dev/null
make -j"$JOBS" install >/dev/null

while read -r stem rockspec; do
    dir=$(unpack "$stem")
    echo "luarocks make $stem $rockspec"
    (cd "$dir" && MAKEFLAGS=-j"$JOBS" "$PREFIX/bin/luarocks" make "$rockspec" >/dev/null)
done <<ROCKS
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
cd /
rm -rf "$WORK" "$HOME/.cache/luarocks"
"$PREFIX/bin/th" -e "require 'nn'; require 'nnx'; require 'optim'; require 'image'; require 'pl'"
