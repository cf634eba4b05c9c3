"""python -m ipccache run|stats|config|lib, and the console scripts.

    python -m ipccache lib             print the library's path
                                       (LD_PRELOAD=$(python -m ipccache lib) ...)
    python -m ipccache run ARGS...     same as ipccache-run ARGS...
    python -m ipccache stats ARGS...   same as ipccache-stats ARGS...
    python -m ipccache config ARGS...  same as ipccache-config ARGS...

The tools are the packaged scripts themselves, run in place of this process.
"""

import os
import sys

from . import library_path, tool_path

USAGE = "usage:\n" + __doc__.split("\n\n")[1]


def _exec(argv):
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.exit("ipccache: cannot run %s: %s" % (argv[0], e.strerror))


def run_tool(args=None):
    """ipccache-run: it finds the library next to itself (../lib)."""
    args = sys.argv[1:] if args is None else args
    _exec(["bash", tool_path("ipccache-run")] + list(args))


def stats_tool(args=None):
    args = sys.argv[1:] if args is None else args
    _exec([sys.executable, tool_path("ipccache-stats")] + list(args))


def config_tool(args=None):
    """ipccache-config: the library's settings parser, a static executable."""
    args = sys.argv[1:] if args is None else args
    _exec([tool_path("ipccache-config")] + list(args))


# The commands of python -m ipccache, each with its console script's function.
COMMANDS = {"run": run_tool, "stats": stats_tool, "config": config_tool}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lib"] and len(argv) == 1:
        print(library_path())
        return 0
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv:
        sys.stderr.write("ipccache: unknown command %r\n" % " ".join(argv))
    sys.stderr.write(USAGE + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
