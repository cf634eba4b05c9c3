"""ipccache: a cache of CUDA IPC memory mappings, loaded with LD_PRELOAD.

The package carries libipccache.so and the tools; it never loads the library
into the Python process itself. A launcher written in Python puts
library_path() into the LD_PRELOAD of the processes it starts.
"""

import os

__version__ = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))


def _packaged(*parts):
    path = os.path.join(_HERE, *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(
            "ipccache: %s is not in this installation (install the wheel, or run "
            "make and use the tools in the source tree)" % path)
    return path


def library_path():
    """Absolute path of libipccache.so, for LD_PRELOAD."""
    return _packaged("lib", "libipccache.so")


def tool_path(name):
    """Absolute path of a packaged tool: ipccache-run, ipccache-stats or ipccache-config."""
    return _packaged("bin", name)
