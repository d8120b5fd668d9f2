#!/usr/bin/env bash
# install_test.sh BUILD_DIR SOURCE_DIR: installs into a scratch prefix, then builds a user program
# against it twice, through pkg-config and through find_package(hccl), and runs both.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -1)
export PKG_CONFIG_PATH="$libdir/pkgconfig"
export LD_LIBRARY_PATH="$libdir"
cc -o "$tmp/consumer_pc" "$src/consumer.c" $(pkg-config --cflags --libs hccl)
"$tmp/consumer_pc"
mkdir -p "$tmp/proj"
cp "$src/consumer.c" "$tmp/proj/"
cp "$src/CMakeLists.txt.in" "$tmp/proj/CMakeLists.txt"
cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/proj/build" >/dev/null
"$tmp/proj/build/consumer"
echo "install: pkg-config and find_package(hccl) both work"
