"""Stand-ins for the heavy modules that SGLang's transport imports but never calls.

tools/peer_suites.sh (suite sglang) puts this folder on PYTHONPATH, so every
interpreter of the run, spawned children included, loads it at start-up.
Only imports are replaced, never SGLang's own code:

  IPython                  sglang/utils.py imports IPython.display (HTML,
                           display) for notebooks; they are never called here.
  sglang.test.test_utils   the unit test's CustomTestCase; the real module
                           imports SGLang's whole server and test harness.
                           Here it is unittest.TestCase (its retry-on-CI
                           wrapper is not wanted: a failure must show).
  transformers             only with SGLANG_PEER_STUB_TRANSFORMERS=1 (the
                           driver of the transport): None, so SGLang's
                           optional imports of it see "not installed" and skip
                           the Hugging Face patches. The unit test imports
                           SGLang's model configs, which need the real one.

SGLANG_PEER_DEPS names the folder of the small pure-Python packages (and a
few compiled wheels) the fetch step unpacked; it goes at the END of sys.path,
so a package the machine already has wins over the fetched copy.
"""
import os
import sys
import types
import unittest


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _unused(*_args, **_kwargs):
    raise RuntimeError(f"{__name__}: a stand-in was called: the run needs the real module")


def _install():
    deps = os.environ.get("SGLANG_PEER_DEPS")
    if deps and deps not in sys.path:
        sys.path.append(deps)
    display = _module("IPython.display", HTML=_unused, display=_unused)
    ipython = _module("IPython", display=display)
    ipython.__path__ = []
    _module("sglang.test.test_utils", CustomTestCase=unittest.TestCase)
    if os.environ.get("SGLANG_PEER_STUB_TRANSFORMERS") == "1":
        sys.modules["transformers"] = None


_install()
