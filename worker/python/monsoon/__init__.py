"""Monsoon's Python package: PyTorch training scripts as Monsoon workers.

`monsoon.torch` is the API (README "Bring your own model"); `_monsoon` is
its C++ side (worker/python/monsoon_ext.cc), built by ./tools/setup.sh.
"""

try:  # installed by tools/setup.sh: the extension inside the package
    from . import _monsoon  # noqa: F401
except ImportError:  # from Bazel's runfiles: the extension beside it
    import _monsoon  # noqa: F401

Error = _monsoon.Error
