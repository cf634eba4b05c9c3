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
  sgl_kernel               SGLang's native kernels (a compiled package, not
  sgl_kernel.quantization  installed on the GPU machine). On CUDA, the unit
                           test's schedule_batch imports SGLang's model
                           configs, hence its quantization methods, which
                           import seven kernels at module level (STAND_INS);
                           the transport never calls one. Each is a function
                           that raises when called; any other name or
                           submodule stays missing, so SGLang's own ImportError
                           fallbacks apply. Only where the real one is absent.
  transformers             only with SGLANG_PEER_STUB_TRANSFORMERS=1 (the
                           driver of the transport): None, so SGLang's
                           optional imports of it see "not installed" and skip
                           the Hugging Face patches. The unit test imports
                           SGLang's model configs, which need the real one.

SGLANG_PEER_DEPS names the folder of the small pure-Python packages (and a
few compiled wheels) the fetch step unpacked; it goes at the END of sys.path,
so a package the machine already has wins over the fetched copy.
"""
import importlib.abc
import importlib.machinery
import os
import sys
import types
import unittest

# Native packages that SGLang's import chain reaches on a CUDA machine (its
# quantization methods import kernels at module level) but that the transport
# and its test never call: each module with the names imported from it
# unconditionally. Only those: a name or submodule not listed stays missing,
# so SGLang's own `except ImportError` fallbacks apply as without the package.
# The finder comes last in sys.meta_path: an installed package wins.
STAND_INS = {
    "sgl_kernel": ("int8_scaled_mm", "moe_sum", "moe_sum_reduce"),
    "sgl_kernel.quantization": ("ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8",
                                "ggml_mul_mat_vec_a8"),
}


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _unused(*_args, **_kwargs):
    raise RuntimeError(f"{__name__}: a stand-in was called: the run needs the real module")


def _placeholder(module, name):
    why = (f"{module}.{name} is a stand-in (the package is not installed): "
           "the run needs the real one")

    def placeholder(*_args, **_kwargs):
        raise RuntimeError(f"{__name__}: {why}")
    placeholder.__name__ = placeholder.__qualname__ = name
    placeholder.__module__ = module
    return placeholder


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in STAND_INS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        module.__path__ = []  # a package, so that its listed submodules import
        for name in STAND_INS[module.__name__]:
            setattr(module, name, _placeholder(module.__name__, name))


def _install():
    deps = os.environ.get("SGLANG_PEER_DEPS")
    if deps and deps not in sys.path:
        sys.path.append(deps)
    display = _module("IPython.display", HTML=_unused, display=_unused)
    ipython = _module("IPython", display=display)
    ipython.__path__ = []
    _module("sglang.test.test_utils", CustomTestCase=unittest.TestCase)
    sys.meta_path.append(_StandInFinder())
    if os.environ.get("SGLANG_PEER_STUB_TRANSFORMERS") == "1":
        sys.modules["transformers"] = None


_install()
