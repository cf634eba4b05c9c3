#!/usr/bin/env python3
"""An engine's own numbers: requests/s, time to first token, weight-sync step time.

What is SGLang's code and what is this bench's:
  SGLang's (the fetched 0.5.23 files, imported, never changed):
    MmItemMemoryPool, CudaIpcTensorTransportProxy (the multimodal CUDA IPC
    transport: wrap_tensor in the producer, reconstruct_on_target_device in
    the scheduler, its stream-ordered ready/ack words, its recycler thread,
    its pool-handle cache), MultiprocessingSerializer and
    FlattenedTensorBucket (update_weights_from_tensor's payloads).
  This bench's (there is no real SGLang scheduler here):
    the producer process standing for the tokenizer worker (it puts each
    request's image features into the pool) and the load generator in it;
    the scheduler process: simple batching (up to --max-batch requests a
    batch), SGLang's overlap shape (the next batch's features are
    reconstructed on the scheduler's stream while the previous batch's
    forward runs on a forward stream), a prefill of a transformers model
    built from a published configuration with random weights, first token
    on the host; the weight-sync trainer and engine loops.

Model: Qwen2.5-VL-3B-Instruct's configuration (written below, no download),
random bf16 weights. --vision on: its vision tower and language model
(Qwen2_5_VLForConditionalGeneration) run on the pixel values its processor
makes for a --image-size square image (1024: 5476 patches of 1176 values,
1369 image tokens). --vision off: the language model alone; the pixel
values still travel, and one linear layer of the bench (the patch merger's
shape) turns them into the 1369 image embeddings.

usage:
  engine_bench.py serve [options]   one producer + --tp scheduler ranks per
                                    allocator; SGLang's cache off, then on;
                                    fixed concurrency, then a burst
  engine_bench.py sync [options]    weight sync, per tensor and bucketed,
                                    while the engine keeps forwarding
  engine_bench.py report A1 B A2    Markdown tables from the --out files of
                                    the runs without / with / without
The library is not chosen here: run the whole command without and with
LD_PRELOAD (tools/bench/bench.sh, BENCH_PARTS=engine, does A/B/A).
SGLang must be importable: tools/bench/bench.sh unpacks `make peer-fetch`'s
copy and puts it on PYTHONPATH with tools/sglang_peer/site.
Exit status: 0 done (or skipped: no CUDA GPU), 1 a run failed, 2 a usage error
or SGLang's files are missing.
"""
import argparse
import json
import math
import os
import pickle
import sys
import time

ALLOCS = ("legacy", "expandable")
CACHES = ("off", "on")
SYNC_MODES = ("tensor", "bucket")
# Where an engine's step goes (host time): waiting for the next message, the
# forwards' enqueue, SGLang's deserialize (PyTorch's rebuild: the IPC open),
# the bucket's unflatten, the copies' enqueue, dropping the received tensors
# (the IPC close), the final wait for the copies.
SYNC_PHASES = ("queue_wait", "enqueue_forwards", "deserialize", "unflatten", "copy", "release",
               "final_sync")
# The producer's features cycle through this many source tensors.
FEATURE_SOURCES = 4

# Qwen2.5-VL-3B-Instruct's published config.json (the values that shape the
# computation); its language model is Qwen2.5-3B's.
QWEN25_VL_3B = {
    "text": {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True,
    },
    "vision": {
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "hidden_act": "silu", "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
    },
    "image_token_id": 151655, "video_token_id": 151656,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653,
}
# The same shapes, scaled down: a smoke run's model.
TINY = {
    "text": dict(QWEN25_VL_3B["text"], vocab_size=151936, hidden_size=512, intermediate_size=512,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "vision": dict(QWEN25_VL_3B["vision"], depth=2, hidden_size=128, intermediate_size=256,
                   num_heads=4, out_hidden_size=512, fullatt_block_indexes=[1]),
    **{k: v for k, v in QWEN25_VL_3B.items() if k.endswith("_id")},
}
MODELS = {"qwen2.5-vl-3b": QWEN25_VL_3B, "tiny": TINY}


def note(msg):
    print(f"engine: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- arithmetic (no torch)

def image_grid(size, patch=14, merge=2, temporal=2, chans=3):
    """What Qwen2.5-VL's processor makes of a size x size image: (patches per
    side, patches, values per patch, image tokens). Its smart_resize rounds
    each side to a multiple of patch * merge."""
    factor = patch * merge
    side = max(factor, int(round(size / factor)) * factor)
    grid = side // patch
    patches = grid * grid
    return grid, patches, chans * temporal * patch * patch, patches // (merge * merge)


def percentile(sorted_vals, q):
    """Nearest-rank percentile of an ascending list (q in 0..100); None if empty."""
    if not sorted_vals:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_vals)))
    return sorted_vals[min(rank, len(sorted_vals)) - 1]


def median(vals):
    vals = sorted(vals)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


def summarize_phase(records, t_start_ns, t_end_ns):
    """One load phase's figures from its requests' records: dicts with
    t_issue, t_first (ns, one clock for all processes), transport_ns (the
    scheduler's reconstruct + release of the request's features), batch,
    gpu_ms (the forward of the request's batch, device time)."""
    n = len(records)
    elapsed = (t_end_ns - t_start_ns) / 1e9
    ttft = sorted((r["t_first"] - r["t_issue"]) / 1e6 for r in records)
    transport = sorted(r["transport_ns"] / 1e6 for r in records)
    batches = {}
    for r in records:
        batches[r["batch"]] = r["gpu_ms"]
    gpu_ms = sum(batches.values())
    return {
        "requests": n,
        "elapsed_s": elapsed,
        "req_per_s": n / elapsed if elapsed > 0 else None,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "transport_p50_ms": percentile(transport, 50),
        "transport_mean_ms": sum(transport) / n if n else None,
        # The scheduler's wall time that went to the transport: it runs on
        # the scheduler's one thread, between forwards.
        "transport_share": (sum(transport) / 1e3) / elapsed if elapsed > 0 else None,
        "gpu_busy_share": (gpu_ms / 1e3) / elapsed if elapsed > 0 else None,
        "batches": len(batches),
        "mean_batch": n / len(batches) if batches else None,
        # Features whose reconstructed values differed from their source
        # (--check; 0 without it).
        "wrong_features": sum(r.get("wrong", 0) for r in records),
    }


def summarize_steps(step_ms, warmup):
    timed = sorted(step_ms[warmup:])
    return {"steps": len(timed), "step_p50_ms": median(timed), "step_min_ms": timed[0] if timed else None,
            "step_max_ms": timed[-1] if timed else None}


def summarize_phases(phases, warmup):
    """Each phase's median over the timed steps (the steps after warmup)."""
    timed = phases[warmup:]
    keys = sorted({k for p in timed for k in p})
    return {k: median([p[k] for p in timed if k in p]) for k in keys}


# ----------------------------------------------------------------- arguments

def _positive(name):
    def conv(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, not {text!r}")
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, not {value}")
        return value
    return conv


def _choices(name, allowed):
    def conv(text):
        items = [t for t in text.split(",") if t]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            what = f"unknown {bad[0]!r}" if bad else "empty"
            raise argparse.ArgumentTypeError(f"{name}: {what} (choose from {', '.join(allowed)})")
        return items
    return conv


def parse_args(argv):
    p = argparse.ArgumentParser(prog="engine_bench.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "sync"):
        s = sub.add_parser(name)
        s.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-vl-3b")
        s.add_argument("--allocs", type=_choices("--allocs", ALLOCS), default=list(ALLOCS))
        s.add_argument("--timeout", type=float, default=240.0, help="seconds per allocator")
        s.add_argument("--out", help="write the results as JSON here")
        s.add_argument("--label", default="", help="a name for this run in the report (A1, B, A2)")
        s.add_argument("--profile-dir", help="write a torch.profiler table of a stretch of the run "
                       "here (serve: scheduler batches 20-35; sync: the last step in the engine)")
        s.add_argument("--check", action="store_true",
                       help="check values: serve, each reconstructed feature against its source's "
                       "checksum; sync, the trainer negates its weights before each step and the "
                       "engine's weights are compared with the trainer's after the last")
    s = sub.choices["serve"]
    s.add_argument("--tp", type=_positive("--tp"), default=1,
                   help="scheduler ranks, one per GPU, each reconstructing every feature")
    s.add_argument("--caches", type=_choices("--caches", CACHES), default=list(CACHES),
                   help="SGLang's pool-handle cache (use_pool_handle_cache), in this order")
    s.add_argument("--vision", choices=("on", "off"), default="off",
                   help="on: Qwen2.5-VL's vision tower too (transformers' attention without flash-attn loops over its windows)")
    s.add_argument("--image-size", type=_positive("--image-size"), default=1024)
    s.add_argument("--prompt-tokens", type=_positive("--prompt-tokens"), default=64)
    s.add_argument("--max-batch", type=_positive("--max-batch"), default=4)
    s.add_argument("--concurrency", type=_positive("--concurrency"), default=16)
    s.add_argument("--requests", type=_positive("--requests"), default=96,
                   help="timed requests at --concurrency")
    s.add_argument("--burst", type=int, default=48, help="requests sent at once (0: no burst)")
    s.add_argument("--warmup", type=int, default=12, help="untimed requests before each cache setting")
    s.add_argument("--pool-mb", type=_positive("--pool-mb"), default=1024,
                   help="the pool (SGLANG_MM_FEATURE_CACHE_MB, SGLang's default 1024)")
    s = sub.choices["sync"]
    s.add_argument("--modes", type=_choices("--modes", SYNC_MODES), default=list(SYNC_MODES))
    s.add_argument("--steps", type=_positive("--steps"), default=6)
    s.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    s.add_argument("--bucket-mb", type=_positive("--bucket-mb"), default=512)
    s.add_argument("--forwards", type=int, default=4,
                   help="forwards the engine enqueues at the start of each step (it keeps serving)")
    rep = sub.add_parser("report")
    rep.add_argument("files", nargs="+", help="without, with[, without again]")
    args = p.parse_args(argv)
    if args.cmd == "serve":
        if args.burst < 0 or args.warmup < 0:
            p.error("--burst and --warmup must not be negative")
        _, patches, per_patch, _ = image_grid(args.image_size)
        need = (max(args.concurrency, args.burst) + 1) * patches * per_patch * 2
        if need > args.pool_mb << 20:
            p.error(f"{max(args.concurrency, args.burst)} features of {patches}x{per_patch} bf16 "
                    f"do not fit in a {args.pool_mb} MiB pool")
    elif args.cmd == "sync":
        if args.warmup < 0 or args.warmup >= args.steps or args.forwards < 0:
            p.error("--warmup must be below --steps; --forwards not negative")
    elif not 2 <= len(args.files) <= 3:
        p.error("report takes two or three files")
    return args


# ----------------------------------------------------------------- environment

def require_sglang():
    """SGLang's transport importable, else exit 2 with what to do."""
    try:
        import sglang.srt.multimodal.transport.cuda_ipc  # noqa: F401
    except ImportError as exc:
        print("engine: SGLang's files are missing: run `make peer-fetch` on a machine with the "
              "network, then `BENCH_PARTS=engine make bench` (it unpacks them); "
              f"import error: {exc}", file=sys.stderr)
        sys.exit(2)


def cuda_gpus():
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def real_transformers():
    """tools/sglang_peer/site hides transformers from SGLang's imports
    (SGLANG_PEER_STUB_TRANSFORMERS=1); the model needs the real one."""
    if sys.modules.get("transformers", 0) is None:
        del sys.modules["transformers"]
    import transformers
    return transformers


class Profile:
    """torch.profiler over a stretch of a run (CPU ops, CUDA runtime calls and
    kernels), written as tables to DIR/NAME.txt; nothing without DIR."""

    def __init__(self, directory, name):
        self.path = os.path.join(directory, name + ".txt") if directory else None
        self.prof = None

    def start(self):
        if not self.path or self.prof is not None:
            return
        import torch.profiler as tp
        self.prof = tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.CUDA])
        self.prof.start()

    def stop(self, note_text=""):
        if self.prof is None:
            return
        self.prof.stop()
        avg = self.prof.key_averages()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(note_text + "\n\n## by self CPU time\n\n")
            f.write(avg.table(sort_by="self_cpu_time_total", row_limit=40))
            f.write("\n\n## by self device time\n\n")
            f.write(avg.table(sort_by="self_device_time_total", row_limit=25))
        self.prof, self.path = None, None


def read_stats(pid):
    """The last ipccache stats line process `pid` wrote (IPCCACHE_STATS_FILE
    with %p), or None: the SGLang driver's reader."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sglang_peer"))
    from driver import read_stats as driver_read_stats
    return driver_read_stats(pid)


# ----------------------------------------------------------------- values (--check)

def checksum(torch, t):
    """An exact checksum of a tensor's bytes, on its device (nothing waited
    for): its 16-bit words as integers, each weighted by its position modulo
    251, so that a stale, shifted or foreign buffer gives another sum."""
    words = t.detach().contiguous().reshape(-1).view(torch.int16).to(torch.int64)
    weights = torch.arange(words.numel(), device=words.device) % 251 + 1
    return (words * weights).sum()


def feature_source(torch, index, shape, device):
    """The producer's index-th feature source: the same values in every
    process (a seeded generator), so a scheduler can know its checksum."""
    gen = torch.Generator(device=device)
    gen.manual_seed(1000 + index)
    return torch.randn(*shape, dtype=torch.bfloat16, device=device, generator=gen)


# ----------------------------------------------------------------- the model

class Engine:
    """The model and its prefill: the first token of each request of a batch."""

    def __init__(self, spec, vision, image_size, prompt_tokens, device):
        import torch
        transformers = real_transformers()
        self.torch, self.device, self.vision = torch, device, vision
        self.grid, self.patches, self.per_patch, self.image_tokens = image_grid(
            image_size, spec["vision"]["patch_size"], spec["vision"]["spatial_merge_size"],
            spec["vision"]["temporal_patch_size"], spec["vision"]["in_chans"])
        gen = torch.Generator(device="cpu").manual_seed(1)
        prompt = torch.randint(1000, 150000, (prompt_tokens,), generator=gen).tolist()
        torch.manual_seed(0)
        with torch.device(device):
            if vision:
                cfg = transformers.Qwen2_5_VLConfig(
                    text_config=dict(spec["text"]), vision_config=dict(spec["vision"]),
                    image_token_id=spec["image_token_id"], video_token_id=spec["video_token_id"],
                    vision_start_token_id=spec["vision_start_token_id"],
                    vision_end_token_id=spec["vision_end_token_id"],
                    tie_word_embeddings=spec["text"]["tie_word_embeddings"])
                cfg._attn_implementation = "sdpa"
                self.model = transformers.Qwen2_5_VLForConditionalGeneration._from_config(
                    cfg, dtype=torch.bfloat16)
                ids = (prompt[: prompt_tokens // 2] + [spec["vision_start_token_id"]]
                       + [spec["image_token_id"]] * self.image_tokens
                       + [spec["vision_end_token_id"]] + prompt[prompt_tokens // 2:])
                self.ids = torch.tensor(ids, dtype=torch.long)
                self.thw = torch.tensor([[1, self.grid, self.grid]], dtype=torch.long)
            else:
                cfg = transformers.Qwen2Config(**spec["text"])
                cfg._attn_implementation = "sdpa"
                self.model = transformers.Qwen2ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
                merge = spec["vision"]["spatial_merge_size"] ** 2
                # This bench's stand-in for the vision tower: the patch
                # merger's shape, one linear layer.
                self.proj = torch.nn.Linear(self.per_patch * merge, spec["text"]["hidden_size"],
                                            dtype=torch.bfloat16)
                self.merge = merge
                self.ids = torch.tensor(prompt, dtype=torch.long)
        self.model.eval()
        self.tokens_per_request = int(self.ids.numel()) + (0 if vision else self.image_tokens)

    def prefill(self, features):
        """features: one (patches, per_patch) bf16 tensor per request. Returns
        the batch's first tokens, on the device (nothing waited for)."""
        torch = self.torch
        b = len(features)
        with torch.inference_mode():
            if self.vision:
                ids = self.ids.unsqueeze(0).expand(b, -1)
                out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 pixel_values=torch.cat(features, 0),
                                 image_grid_thw=self.thw.expand(b, -1), use_cache=False,
                                 logits_to_keep=1)
            else:
                img = torch.stack([self.proj(f.reshape(-1, self.per_patch * self.merge)) for f in features])
                txt = self.model.get_input_embeddings()(self.ids).unsqueeze(0).expand(b, -1, -1)
                out = self.model(inputs_embeds=torch.cat([img, txt], 1), use_cache=False,
                                 logits_to_keep=1)
            return out.logits[:, -1].argmax(-1)


# ----------------------------------------------------------------- serving: scheduler

def scheduler_main(args, rank, in_q, peer_qs, done_q, result_q, ready_q):
    """SGLang's scheduler, played by this bench: rank 0 batches and hands each
    batch to the other ranks (as SGLang broadcasts requests to its TP ranks);
    every rank reconstructs every feature with SGLang's proxy."""
    import collections
    import queue as queue_mod
    import torch
    import sglang.srt.multimodal.transport.cuda_ipc  # noqa: F401  (unpickling needs it)

    try:
        torch.cuda.set_device(rank)
        dev = torch.device(f"cuda:{rank}")
        engine = Engine(MODELS[args.model], args.vision == "on", args.image_size, args.prompt_tokens, dev)
        warm = [torch.randn(engine.patches, engine.per_patch, dtype=torch.bfloat16, device=dev)
                for _ in range(args.max_batch)]
        for n in sorted({1, args.max_batch}):
            engine.prefill(warm[:n]).cpu()
        del warm
        expected = [checksum(torch, feature_source(torch, i, (engine.patches, engine.per_patch), dev))
                    for i in range(FEATURE_SOURCES)] if args.check else None
        torch.cuda.synchronize()
    except Exception as exc:
        ready_q.put((rank, os.getpid(), f"{type(exc).__name__}: {exc}"))
        raise
    ready_q.put((rank, os.getpid(), None))

    fwd = torch.cuda.Stream(device=dev)
    profile = Profile(args.profile_dir if rank == 0 else None,
                      f"serve-{alloc_here()}-{args.label or 'run'}")
    pending = collections.deque()
    inflight = None
    stopping = False
    batch_no = 0

    def launch(batch):
        nonlocal batch_no
        feats, transport, same = [], [], []
        for rid, _t, proxy in batch:
            t0 = time.monotonic_ns()
            feats.append(proxy.reconstruct_on_target_device(rank, consumer_count=1, consumer_rank=rank))
            proxy.reconstruct_tensor = None  # the scheduler holds the tensor, not the proxy
            transport.append(time.monotonic_ns() - t0)
            if expected is not None:
                same.append(checksum(torch, feats[-1]) == expected[rid % FEATURE_SOURCES])
        fwd.wait_stream(torch.cuda.current_stream(dev))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(fwd):
            start.record()
            tokens = engine.prefill(feats)
            host = torch.empty(len(batch), dtype=torch.long, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            end.record()
        for f in feats:
            f.record_stream(fwd)
        batch_no += 1
        return {"batch": batch, "transport": transport, "host": host, "start": start, "end": end,
                "no": batch_no, "same": same}

    def complete(item):
        item["end"].synchronize()
        wrong = [0 if bool(s) else 1 for s in item["same"]] or [0] * len(item["batch"])
        if rank == 0:
            for _ in peer_qs:
                _no, peer_wrong = done_q.get(timeout=args.timeout)
                wrong = [a + b for a, b in zip(wrong, peer_wrong)]
        t_first = time.monotonic_ns()
        gpu_ms = item["start"].elapsed_time(item["end"])
        if rank == 0:
            for (rid, t_issue, _p), tr, bad in zip(item["batch"], item["transport"], wrong):
                result_q.put({"rid": rid, "t_issue": t_issue, "t_first": t_first, "transport_ns": tr,
                              "batch": item["no"], "gpu_ms": gpu_ms, "size": len(item["batch"]),
                              "wrong": bad})
        else:
            done_q.put((item["no"], wrong))

    while True:
        if rank == 0:
            block = inflight is None and not pending and not stopping
            try:
                while True:
                    msg = in_q.get(timeout=args.timeout) if block else in_q.get_nowait()
                    block = False
                    if msg is None:
                        stopping = True
                        break
                    pending.append(msg)
            except queue_mod.Empty:
                pass
            batch = [pending.popleft() for _ in range(min(args.max_batch, len(pending)))]
            if batch and peer_qs:
                # Pickled now: the proxies change once this rank reconstructs.
                blob = pickle.dumps(batch)
                for q in peer_qs:
                    q.put(blob)
        else:
            batch = in_q.get(timeout=args.timeout)
            if batch is None:
                stopping, batch = True, []
            else:
                batch = pickle.loads(batch)
        if batch_no == 20:
            profile.start()
        elif batch_no == 36:
            profile.stop(f"scheduler rank 0, batches 20-35 (the first cache setting, at concurrency), "
                         f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}")
        new = launch(batch) if batch else None
        if inflight is not None:
            complete(inflight)
        inflight = new
        if stopping and inflight is None and not pending:
            break
    for q in peer_qs:
        q.put(None)


# ----------------------------------------------------------------- serving: producer + load

def producer_main(args, sched_q, result_q, ready_q, out_q):
    """The tokenizer worker (SGLang's pool, its proxies) and the load generator."""
    import torch
    from sglang.srt.multimodal.transport.cuda_ipc import (
        MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL,
        MmItemMemoryPool,
    )

    torch.cuda.set_device(0)
    spec = MODELS[args.model]["vision"]
    _, patches, per_patch, _ = image_grid(args.image_size, spec["patch_size"], spec["spatial_merge_size"],
                                          spec["temporal_patch_size"], spec["in_chans"])
    pool = MmItemMemoryPool(memory_size=args.pool_mb << 20, recycle_interval=MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL,
                            base_gpu_id=0, consumer_count=args.tp)
    sources = [feature_source(torch, i, (patches, per_patch), "cuda:0") for i in range(FEATURE_SOURCES)]
    phases, error = [], None
    try:
        ranks = [ready_q.get(timeout=args.timeout) for _ in range(args.tp)]
        bad = [r for r in ranks if r[2]]
        if bad:
            raise RuntimeError(f"scheduler rank {bad[0][0]}: {bad[0][2]}")
        out_q.put(("pids", [r[1] for r in sorted(ranks)]))
        state = {"rid": 0}

        def issue(cache_on):
            t_issue = time.monotonic_ns()
            src = sources[state["rid"] % FEATURE_SOURCES]
            proxy = pool.wrap_tensor(src, use_pool_handle_cache=cache_on)
            deadline = time.monotonic() + args.timeout
            while proxy is None:  # full until the scheduler's acks recycle a slice
                if time.monotonic() > deadline:
                    raise RuntimeError("the pool stayed full")
                time.sleep(0.0005)
                proxy = pool.wrap_tensor(src, use_pool_handle_cache=cache_on)
            sched_q.put((state["rid"], t_issue, proxy))
            state["rid"] += 1
            return t_issue

        def at_concurrency(n, cache_on):
            records, issued, t0 = [], 0, None
            while issued < min(n, args.concurrency):
                t = issue(cache_on)
                t0 = t if t0 is None else t0
                issued += 1
            while len(records) < n:
                records.append(result_q.get(timeout=args.timeout))
                if issued < n:
                    issue(cache_on)
                    issued += 1
            return records, t0, max(r["t_first"] for r in records)

        def burst(n, cache_on):
            t0 = None
            for _ in range(n):
                t = issue(cache_on)
                t0 = t if t0 is None else t0
            records = [result_q.get(timeout=args.timeout) for _ in range(n)]
            return records, t0, max(r["t_first"] for r in records)

        for cache in args.caches:
            on = cache == "on"
            if args.warmup:
                at_concurrency(args.warmup, on)
            recs, t0, t1 = at_concurrency(args.requests, on)
            phases.append(dict(summarize_phase(recs, t0, t1), cache=cache, load=f"concurrency {args.concurrency}"))
            note(f"  SGLang's cache {cache}, concurrency {args.concurrency}: "
                 f"{phases[-1]['req_per_s']:.1f} req/s, TTFT p50 {phases[-1]['ttft_p50_ms']:.1f} ms")
            if args.burst:
                recs, t0, t1 = burst(args.burst, on)
                phases.append(dict(summarize_phase(recs, t0, t1), cache=cache, load=f"burst {args.burst}"))
                note(f"  SGLang's cache {cache}, burst {args.burst}: "
                     f"{phases[-1]['req_per_s']:.1f} req/s, TTFT p50 {phases[-1]['ttft_p50_ms']:.1f} ms")
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sched_q.put(None)
        out_q.put(("done", {"phases": phases, "error": error}))
        time.sleep(1.0)  # the scheduler's last acks, before the pool goes
        pool.shutdown()


def set_alloc_env(alloc):
    """Spawned children take the environment as it is at their start."""
    saved = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return saved


def alloc_here():
    """The allocator this process was started with (set_alloc_env's)."""
    return "expandable" if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") \
        else "legacy"


def restore_env(saved):
    if saved is None:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = saved


def finish(procs, timeout):
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(10)
    return [p.exitcode for p in procs]


def serve_alloc(args, alloc):
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    sched_qs = [ctx.Queue() for _ in range(args.tp)]
    result_q, ready_q, done_q, out_q = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    saved = set_alloc_env(alloc)
    scheds = [ctx.Process(target=scheduler_main,
                          args=(args, r, sched_qs[r], sched_qs[1:] if r == 0 else [], done_q, result_q, ready_q))
              for r in range(args.tp)]
    producer = ctx.Process(target=producer_main, args=(args, sched_qs[0], result_q, ready_q, out_q))
    for p in scheds + [producer]:
        p.start()
    restore_env(saved)
    result = {"alloc": alloc, "phases": [], "error": None, "scheduler_pids": []}
    deadline = time.monotonic() + args.timeout * 2
    while time.monotonic() < deadline:
        try:
            kind, payload = out_q.get(timeout=1.0)
        except queue_mod.Empty:
            if producer.exitcode is not None:
                result["error"] = f"the producer exited ({producer.exitcode}) without a result"
                break
            continue
        if kind == "pids":
            result["scheduler_pids"] = payload
        else:
            result.update(payload)
            break
    else:
        result["error"] = "no result in time"
    codes = finish(scheds + [producer], 30)
    if result["error"] is None and any(codes):
        result["error"] = f"exit status: schedulers {codes[:-1]}, producer {codes[-1]}"
    result["scheduler_stats"] = [read_stats(pid) for pid in result["scheduler_pids"]]
    return result


def cmd_serve(args):
    ngpu = cuda_gpus()
    if ngpu < 1:
        print("engine: skipped: no CUDA GPU (torch sees none)")
        return 0
    if ngpu < args.tp:
        print(f"engine: --tp {args.tp} needs {args.tp} GPUs; {ngpu} seen", file=sys.stderr)
        return 2
    require_sglang()
    results = []
    for alloc in args.allocs:
        note(f"serve {args.label or ''} {alloc}: model {args.model}, vision {args.vision}, tp {args.tp}")
        r = serve_alloc(args, alloc)
        if r["error"]:
            note(f"serve {alloc}: FAILED: {r['error']}")
        results.append(r)
    write_out(args, "serve", results)
    return 1 if any(r["error"] for r in results) else 0


def write_out(args, kind, results):
    if not args.out:
        return
    opts = {k: v for k, v in vars(args).items() if k not in ("cmd", "out")}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"kind": kind, "label": args.label, "preload": os.environ.get("LD_PRELOAD", ""),
                   "args": opts, "results": results}, f, indent=1)


# ----------------------------------------------------------------- weight sync

def _sync_chunks(named, bucket_bytes):
    """Consecutive runs of (name, tensor) of at most bucket_bytes each (a
    tensor larger than a bucket is a bucket of its own)."""
    chunks, cur, size = [], [], 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > bucket_bytes:
            chunks.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += nbytes
    if cur:
        chunks.append(cur)
    return chunks


def trainer_main(args, mode, req_q, ack_q, out_q):
    """The RL trainer: a real model's parameters (random), sent every step with
    SGLang's MultiprocessingSerializer (FlattenedTensorBucket when bucketed)."""
    import torch
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    try:
        torch.cuda.set_device(0)
        transformers = real_transformers()
        with torch.device("cuda:0"):
            model = transformers.Qwen2ForCausalLM._from_config(
                transformers.Qwen2Config(**MODELS[args.model]["text"]), dtype=torch.bfloat16)
        named = list(model.named_parameters())
        ack_q.get(timeout=args.timeout)  # the engine is ready
        steps, phases = [], []
        # A profiled step runs last, beyond --steps, and is not timed.
        for step in range(args.steps + (1 if args.profile_dir else 0)):
            if args.check:  # new values every step: a stale mapping would show
                with torch.no_grad():
                    for _name, t in named:
                        t.neg_()
                torch.cuda.synchronize()
            t0 = time.monotonic_ns()
            keep, serialize_ns = [], 0
            if mode == "tensor":
                for name, t in named:
                    ts = time.monotonic_ns()
                    blob = MultiprocessingSerializer.serialize([(name, t.detach())])
                    serialize_ns += time.monotonic_ns() - ts
                    req_q.put(blob)
            else:
                for chunk in _sync_chunks([(n, t.detach()) for n, t in named], args.bucket_mb << 20):
                    ts = time.monotonic_ns()
                    bucket = FlattenedTensorBucket(named_tensors=chunk)
                    keep.append(bucket)
                    blob = MultiprocessingSerializer.serialize(
                        {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()})
                    serialize_ns += time.monotonic_ns() - ts
                    req_q.put(blob)
            req_q.put("step")
            done = ack_q.get(timeout=args.timeout)
            del keep
            if step == args.steps:
                continue
            # CLOCK_MONOTONIC is one clock for every process of the machine.
            steps.append((done.pop("copies_done_ns") - t0) / 1e6)
            forwards = done.pop("forwards")
            phases.append(dict(done, trainer_serialize_ms=serialize_ns / 1e6))
        req_q.put(None)
        result = {"step_ms": steps, "phases_ms": phases, "forwards": forwards, "tensors": len(named),
                  "bytes": sum(t.numel() * t.element_size() for _, t in named), "error": None}
        if args.check:
            theirs = ack_q.get(timeout=args.timeout)["checksums"]
            ours = {name: int(checksum(torch, t)) for name, t in named}
            result["checked_tensors"] = len(ours)
            result["wrong_tensors"] = sum(1 for name, v in ours.items() if theirs.get(name) != v)
        out_q.put(result)
    except Exception as exc:
        req_q.put(None)
        out_q.put({"step_ms": [], "error": f"{type(exc).__name__}: {exc}"})


def capture_forward(torch, model, ids):
    """The engine's forward as a CUDA graph (as engines serve), or None where
    it cannot be captured (then the forwards run eagerly)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception as exc:  # noqa: BLE001  (any capture failure means eager)
        note(f"sync: the forward cannot be captured as a CUDA graph ({type(exc).__name__}: {exc}); eager")
        torch.cuda.synchronize()
        return None


def sync_engine_main(args, mode, req_q, ack_q, pid_q):
    """The engine: copies each received tensor into its own model while the
    forwards it enqueued at the step's start run (a CUDA graph each where the
    forward can be captured). A step ends when its copies are done; the
    forwards still running then are waited for, untimed, before the ack."""
    import torch
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    torch.cuda.set_device(0)
    transformers = real_transformers()
    with torch.device("cuda:0"):
        model = transformers.Qwen2ForCausalLM._from_config(
            transformers.Qwen2Config(**MODELS[args.model]["text"]), dtype=torch.bfloat16)
    model.eval()
    params = dict(model.named_parameters())
    ids = torch.randint(1000, 100000, (8, 256), device="cuda:0")
    fwd = torch.cuda.Stream()
    graph = capture_forward(torch, model, ids)
    forwards = "graph" if graph is not None else "eager"

    def enqueue_forwards():
        # A graph's replay is one launch: the host goes on at once. Eager
        # forwards fill the launch queue and hold the host until it drains.
        fwd.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(fwd), torch.inference_mode():
            fwd_start.record()
            for _ in range(args.forwards):
                if graph is not None:
                    graph.replay()
                else:
                    model(input_ids=ids, use_cache=False, logits_to_keep=1)
            fwd_end.record()

    fwd_start, fwd_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    pid_q.put(os.getpid())
    ack_q.put("ready")
    profile = Profile(args.profile_dir, f"sync-{alloc_here()}-{mode}-{args.label or 'run'}")
    started, step_no = False, 0
    spent = dict.fromkeys(SYNC_PHASES, 0)
    while True:
        t_wait = time.monotonic_ns()
        msg = req_q.get(timeout=args.timeout)
        t_got = time.monotonic_ns()
        spent["queue_wait"] += t_got - t_wait
        if msg is None:
            if args.check:
                ack_q.put({"checksums": {name: int(checksum(torch, p)) for name, p in params.items()}})
            break
        if not started:
            if step_no == args.steps:  # the extra step, with --profile-dir
                profile.start()
            enqueue_forwards()
            started = True
            spent["enqueue_forwards"] += time.monotonic_ns() - t_got
        if msg == "step":
            t1 = time.monotonic_ns()
            torch.cuda.current_stream().synchronize()
            copies_done = time.monotonic_ns()
            spent["final_sync"] += copies_done - t1
            fwd.synchronize()  # the step's forwards end before the next step starts (untimed)
            profile.stop(f"engine, weight sync step {step_no + 1} of {args.steps}, {mode}, "
                         f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}")
            ack_q.put({**{f"engine_{k}_ms": v / 1e6 for k, v in spent.items()},
                       "engine_forwards_gpu_ms": fwd_start.elapsed_time(fwd_end),
                       "copies_done_ns": copies_done, "forwards": forwards})
            spent = dict.fromkeys(SYNC_PHASES, 0)
            started = False
            step_no += 1
            continue
        t1 = time.monotonic_ns()
        obj = MultiprocessingSerializer.deserialize(msg)
        t2 = time.monotonic_ns()
        named = (FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"],
                                       metadata=obj["metadata"]).reconstruct_tensors()
                 if isinstance(obj, dict) else obj)
        t3 = time.monotonic_ns()
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)
        t4 = time.monotonic_ns()
        del obj, named, t
        t5 = time.monotonic_ns()
        spent["deserialize"] += t2 - t1
        spent["unflatten"] += t3 - t2
        spent["copy"] += t4 - t3
        spent["release"] += t5 - t4
    torch.cuda.synchronize()


def sync_run(args, alloc, mode):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    req_q, ack_q, out_q, pid_q = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    saved = set_alloc_env(alloc)
    engine = ctx.Process(target=sync_engine_main, args=(args, mode, req_q, ack_q, pid_q))
    trainer = ctx.Process(target=trainer_main, args=(args, mode, req_q, ack_q, out_q))
    engine.start()
    trainer.start()
    restore_env(saved)
    result = {"alloc": alloc, "mode": mode, "error": None}
    try:
        got = out_q.get(timeout=args.timeout * 2)
    except Exception:
        got = {"step_ms": [], "error": "no result in time"}
    try:
        pid = pid_q.get(timeout=1)
    except Exception:
        pid = None
    codes = finish([trainer, engine], 60)
    result.update(got)
    if result["error"] is None and any(codes):
        result["error"] = f"exit status: trainer {codes[0]}, engine {codes[1]}"
    if result["step_ms"]:
        result.update(summarize_steps(result["step_ms"], args.warmup))
        result["phase_p50_ms"] = summarize_phases(result.get("phases_ms") or [], args.warmup)
    result["engine_stats"] = read_stats(pid) if pid else None
    return result


def cmd_sync(args):
    if cuda_gpus() < 1:
        print("engine: skipped: no CUDA GPU (torch sees none)")
        return 0
    require_sglang()
    results = []
    for alloc in args.allocs:
        for mode in args.modes:
            r = sync_run(args, alloc, mode)
            note(f"sync {args.label} {alloc} {mode}: "
                 + (f"FAILED: {r['error']}" if r["error"] else f"step p50 {r['step_p50_ms']:.1f} ms"))
            results.append(r)
    write_out(args, "sync", results)
    return 1 if any(r["error"] for r in results) else 0


# ----------------------------------------------------------------- report

def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def report_serve(runs):
    """Markdown: one row per allocator x SGLang's cache x load; A1 / B / A2."""
    lines = ["| allocator | SGLang's cache | load | req/s without / **with** / without | TTFT p50 ms "
             "| TTFT p99 ms | transport ms per request (share of the scheduler's time) | GPU busy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    cells = {}
    for run in runs:
        for r in run["results"]:
            for ph in r.get("phases", []):
                cells.setdefault((r["alloc"], ph["cache"], ph["load"]), []).append(ph)
    targets = []
    for (alloc, cache, load), phs in cells.items():
        if len(phs) != len(runs):
            continue

        def trio(key, spec):
            vals = [_fmt(p[key], spec) for p in phs]
            if len(vals) >= 2:
                vals[1] = f"**{vals[1]}**"
            return " / ".join(vals)
        transport = " / ".join(f"{_fmt(p['transport_p50_ms'], '.2f')} ({_fmt(p['transport_share'] * 100, '.1f')}%)"
                               for p in phs)
        busy = " / ".join(_fmt(p["gpu_busy_share"] * 100, ".0f") + "%" for p in phs)
        lines.append(f"| {alloc} | {cache} | {load} | {trio('req_per_s', '.1f')} | {trio('ttft_p50_ms', '.0f')} "
                     f"| {trio('ttft_p99_ms', '.0f')} | {transport} | {busy} |")
    lines.append("")
    # The issue's targets, from the run with the library (B) and those without.
    for alloc in ALLOCS:
        for load in sorted({k[2] for k in cells}):
            off, on = cells.get((alloc, "off", load)), cells.get((alloc, "on", load))
            if not off or not on or len(off) < 2 or len(on) < 2:
                continue
            r = _ratio(off[1]["req_per_s"], on[1]["req_per_s"])
            targets.append(f"- {alloc}, {load}: with the library, SGLang's cache off / on = "
                           f"{_fmt(r, '.3f')} (target: within 5%: {'met' if r and r >= 0.95 else 'missed'})")
    for (alloc, cache, load), phs in sorted(cells.items()):
        if len(phs) < 2:
            continue
        without = [p["req_per_s"] for i, p in enumerate(phs) if i != 1]
        gain = _ratio(phs[1]["req_per_s"], sum(without) / len(without))
        slower = phs[1]["req_per_s"] < min(without)
        targets.append(f"- {alloc}, cache {cache}, {load}: with / without (mean) = {_fmt(gain, '.3f')}"
                       + (" (below both runs without)" if slower else ""))
    return "\n".join(lines + targets)


def report_sync(runs):
    lines = ["| allocator | weight sync | step p50 ms without / **with** / without | with / without (mean) |",
             "| --- | --- | --- | --- |"]
    cells = {}
    for run in runs:
        for r in run["results"]:
            cells.setdefault((r["alloc"], r["mode"]), []).append(r.get("step_p50_ms"))
    with_lib = {}
    for (alloc, mode), vals in cells.items():
        if len(vals) != len(runs):
            continue
        shown = [_fmt(v, ".1f") for v in vals]
        if len(shown) >= 2:
            shown[1] = f"**{shown[1]}**"
            with_lib[(alloc, mode)] = vals[1]
        without = [v for i, v in enumerate(vals) if i != 1 and v is not None]
        ratio = _ratio(vals[1], sum(without) / len(without)) if without and len(vals) >= 2 else None
        lines.append(f"| {alloc} | {'per tensor' if mode == 'tensor' else 'buckets'} | {' / '.join(shown)} "
                     f"| {_fmt(ratio, '.2f')} |")
    lines.append("")
    how = sorted({r.get("forwards") or "?" for run in runs for r in run["results"]})
    lines.append(f"The engine's forwards during a step: {', '.join(how)} (graph: CUDA graphs, the host "
                 "goes on at once; eager: the launch queue holds the host).")
    lines.append("")
    lines.extend(report_sync_phases(runs))
    for mode in SYNC_MODES:
        r = _ratio(with_lib.get(("expandable", mode)), with_lib.get(("legacy", mode)))
        if r is not None:
            lines.append(f"- {mode}: expandable / legacy, both with the library = {r:.2f} "
                         f"(target: at most 1.2: {'met' if r <= 1.2 else 'missed'})")
    return "\n".join(lines)


def report_sync_phases(runs):
    """Where a step goes: each phase's median, without / with / without."""
    cells = {}
    for run in runs:
        for r in run["results"]:
            cells.setdefault((r["alloc"], r["mode"]), []).append(r.get("phase_p50_ms") or {})
    keys = [f"engine_{k}_ms" for k in SYNC_PHASES] + ["engine_forwards_gpu_ms", "trainer_serialize_ms"]
    rows = []
    for (alloc, mode), vals in cells.items():
        if len(vals) != len(runs) or not any(vals):
            continue
        for k in keys:
            shown = [_fmt(v.get(k), ".1f") for v in vals]
            if len(shown) >= 2:
                shown[1] = f"**{shown[1]}**"
            rows.append(f"| {alloc} | {'per tensor' if mode == 'tensor' else 'buckets'} "
                        f"| {k[:-3].replace('_', ' ')} | {' / '.join(shown)} |")
    if not rows:
        return []
    return ["Where a step goes (host time, median of the timed steps, ms):", "",
            "| allocator | weight sync | phase | without / **with** / without |",
            "| --- | --- | --- | --- |", *rows, ""]


def cmd_report(args):
    runs = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    kinds = {r.get("kind") for r in runs}
    if len(kinds) != 1:
        print("engine: report: the files are of different kinds (serve and sync)", file=sys.stderr)
        return 2
    print(report_serve(runs) if kinds == {"serve"} else report_sync(runs))
    return 0


def main(argv):
    args = parse_args(argv)
    return {"serve": cmd_serve, "sync": cmd_sync, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
