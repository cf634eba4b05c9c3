"""Stand-ins for what vLLM's, verl's and OpenRLHF's weight-sync code (and vLLM's
multimodal tensor queue) imports but the bench never needs; their own files are
loaded as released.

tools/bench/bench.sh (parts rl and vllm-mm) and tools/peer_suites.sh (suite rl) put this
folder on PYTHONPATH, so every interpreter of a run, spawned children
included, loads it at start-up. tools/rl_peer/fetch.sh took from each wheel
only the files the weight sync reaches; the packages above them are
namespace packages (their __init__.py, which imports the whole project, is
not there). What those files import beyond that is STAND_INS, each name
listed (nothing answers a name not listed):

vLLM (ipc_engine.py, packed_tensor.py, base.py, clients.py):
  vllm.config.utils.config        the decorator of WeightTransferConfig: a
                                  plain dataclass (vLLM's makes a pydantic one)
  vllm.config.parallel            ParallelConfig, a type annotation in base.py
  vllm.model_executor.model_loader.reload
                                  initialize_/finalize_layerwise_reload, called
                                  by start_/finish_weight_update: vLLM's
                                  per-layer weight processing of its own model
                                  classes; the bench's model loads in place, so
                                  they do nothing here
  vllm.model_executor.model_loader.mtp_validation
                                  disable_mtp_completeness_check, a context
                                  around load_weights: does nothing here
vLLM (v1/engine/tensor_ipc.py, the multimodal tensors' queue):
  vllm.logger                     init_logger: logging.getLogger (vLLM's
                                  configures its own handlers and format)
  vllm.v1.serial_utils            OOBTensorConsumer: the base class of
                                  TensorIpcSender, the msgpack encoder's
                                  interface for tensors sent out of band;
                                  an empty class here (the bench calls the
                                  sender itself, as the encoder would)
verl (bucketed_weight_transfer.py):
  verl.workers.rollout.utils      ensure_async_iterator (its real module
                                  imports Ray, FastAPI, uvicorn): an async
                                  iterator over a plain or async iterable
OpenRLHF (ppo_actor.py's broadcast_to_vllm, vllm_worker_wrap.py):
  ray                             remote: the decorator, leaving the class as
                                  is; get: waits for each reference's result()
                                  (the bench's engine handles make them)
  deepspeed                       zero.GatheredParameters: the identity context
                                  broadcast_to_vllm enters per parameter
                                  (ZeRO-3 off: enabled=False, as it is for a
                                  model that is not sharded)
  openrlhf.models, ... (MODULE_NAMES below): names ppo_actor.py imports for
                                  training, never called by the weight sync;
                                  each raises when called; launcher's
                                  BaseModelActor is an empty class (the actor
                                  class's base, defined at import)

RL_PEER_DEPS names the folder of the packages the fetch step unpacked (pyzmq,
pybase64, transformers...); it goes at the END of sys.path, so a package the
machine already has wins over the fetched copy.
"""
import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import logging
import os
import sys


def _unused(module, name):
    why = f"{module}.{name} is a stand-in (tools/rl_peer/site): the weight sync does not call it"

    def placeholder(*_args, **_kwargs):
        raise RuntimeError(f"rl-peer: {why}")
    placeholder.__name__ = placeholder.__qualname__ = name
    placeholder.__module__ = module
    return placeholder


async def ensure_async_iterator(iterable):
    if hasattr(iterable, "__aiter__"):
        async for item in iterable:
            yield item
    else:
        for item in iterable:
            yield item


def _remote(*args, **_options):
    if len(args) == 1 and callable(args[0]) and not _options:
        return args[0]  # @ray.remote
    return lambda cls: cls  # @ray.remote(num_gpus=1)


def _ray_get(refs, timeout=None):
    if isinstance(refs, list):
        return [r.result() for r in refs]
    return refs.result()


class _Zero:
    @staticmethod
    def GatheredParameters(_params, enabled=True, **_kwargs):
        if enabled:
            raise RuntimeError("rl-peer: deepspeed is a stand-in: ZeRO-3 gathering is not available")
        return contextlib.nullcontext()


class OOBTensorConsumer:
    """vLLM's msgpack encoder's out-of-band tensor consumer, as a base class."""


class BaseModelActor:
    """OpenRLHF's launcher.BaseModelActor stands here only as a base class."""


# Module -> its names: a value the code uses, or None for a name imported but
# never called (it raises when called).
STAND_INS = {
    "vllm.config.utils": {"config": dataclasses.dataclass},
    "vllm.config.parallel": {"ParallelConfig": type("ParallelConfig", (), {})},
    "vllm.model_executor": {},  # the two below's parents: not fetched
    "vllm.model_executor.model_loader": {},
    "vllm.model_executor.model_loader.reload": {
        "initialize_layerwise_reload": lambda model: None,
        "finalize_layerwise_reload": lambda model, model_config: None},
    "vllm.model_executor.model_loader.mtp_validation": {
        "disable_mtp_completeness_check": contextlib.nullcontext},
    "vllm.logger": {"init_logger": logging.getLogger},
    "vllm.v1.serial_utils": {"OOBTensorConsumer": OOBTensorConsumer},
    "verl.workers.rollout.utils": {"ensure_async_iterator": ensure_async_iterator},
    "ray": {"remote": _remote, "get": _ray_get},
    "deepspeed": {"zero": _Zero},
    "openrlhf.trainer.ray.launcher": {"BaseModelActor": BaseModelActor},
    "openrlhf.utils.logging_utils": {"init_logger": logging.getLogger},
}
MODULE_NAMES = {
    "openrlhf.models": ("Actor", "PolicyLoss", "aggregate_loss"),
    "openrlhf.models.utils": ("compute_approx_kl", "masked_mean"),
    "openrlhf.trainer.ppo_utils": ("NaiveReplayBuffer",),
    "openrlhf.trainer.ppo_utils.experience": ("Experience",),
    "openrlhf.utils": ("get_tokenizer",),
    "openrlhf.utils.deepspeed": ("DeepspeedStrategy",),
    "openrlhf.utils.deepspeed.deepspeed_utils": ("offload_deepspeed_states", "reload_deepspeed_states"),
    "openrlhf.utils.loss_utils": ("get_loss_batch_info", "iter_grad_accum_global_norm"),
    "openrlhf.utils.vlm_utils": ("merge_mm_train_inputs",),
}
for _mod, _names in MODULE_NAMES.items():
    STAND_INS[_mod] = {n: None for n in _names}


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the names of STAND_INS, first in sys.meta_path: the fetched
    tree's namespace folders of the same name must not win. A stand-in is a
    package whose path is the fetched folder of that name, if any, so that
    the real files under it still import (openrlhf.utils.distributed_util)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in STAND_INS:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        spec.submodule_search_locations = list(real.submodule_search_locations or []) if real else []
        return spec

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        for name, value in STAND_INS[module.__name__].items():
            setattr(module, name, _unused(module.__name__, name) if value is None else value)


def _install():
    deps = os.environ.get("RL_PEER_DEPS")
    for folder in (deps.split(os.pathsep) if deps else []):
        if folder and folder not in sys.path:
            sys.path.append(folder)
    sys.meta_path.insert(0, _StandInFinder())


_install()
