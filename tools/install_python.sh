#!/usr/bin/env bash
# Builds the monsoon Python package's extension (//worker/python:_monsoon.so)
# and installs the package into the user site-packages of Debian's python3
# (/usr/bin/python3, which has python3-torch), so that a script anywhere can
# `import monsoon.torch`. Run by tools/setup.sh; again
# after changing the C++ side. No root needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //worker/python:_monsoon.so
site=$(/usr/bin/python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site/monsoon"
cp worker/python/monsoon/*.py "$site/monsoon/"
install -m 0755 bazel-bin/worker/python/_monsoon.so "$site/monsoon/_monsoon.so"
echo "install_python: monsoon installed in $site (import monsoon.torch)" >&2
