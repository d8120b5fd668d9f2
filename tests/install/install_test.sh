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
# The Python package, where it was built: found through its RPATH, without LD_LIBRARY_PATH.
if [ -n "${HCCL_TEST_PYTHON:-}" ]; then
  pkg=$(dirname "$(find "$tmp/prefix" -path '*/hccl/__init__.py' | head -1)")
  [ -n "$pkg" ] && [ "$pkg" != . ] || { echo "install: no hccl Python package installed"; exit 1; }
  env -u LD_LIBRARY_PATH PYTHONPATH="$(dirname "$pkg")" "$HCCL_TEST_PYTHON" -c '
import numpy as np, hccl
with hccl.Comm(1, hccl.get_unique_id(), 0) as c:
    x = np.ones(4, np.float32); c.all_reduce(x); assert x.tolist() == [1.0] * 4
print("install: import hccl works from", hccl.__file__)'
fi
echo "install: pkg-config and find_package(hccl) both work"
