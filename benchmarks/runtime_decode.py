"""Batch-1 decode speed: the runtime's engine end to end (scheduler, sampler, detokenising every step) against
`transformers` generate (and the decode of its tokens to text) on the same weights and threads, both timed the
same way: the wall time of a request for N + 1 new tokens minus that of a request for 1 (the prefill and the
first token), over N. Also the machine's best measured read bandwidth, the engine's effective bandwidth, and the
runtime's bare forward loop (model + paged cache + argmax, no engine) for what the engine's own work costs.

    .venv/bin/python benchmarks/runtime_decode.py [--threads N] [--tokens 64] [--skip-mixtral] [--device cuda]

Targets: 100M Llama fp32 >= transformers tok/s and effective bandwidth >= 85 % of the best probe;
tiny Mixtral >= 2x transformers. On a machine whose cores are busy with other work, every kernel that opens a
parallel region (both sides have many) stalls unpredictably; ``--threads 1`` then gives the steadier comparison.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agents.runtime import kernels  # noqa: E402
from agents.runtime.commands.serve import packs_by_default  # noqa: E402
from agents.runtime.context import ForwardContext  # noqa: E402
from agents.runtime.layers.linear import pack_layout  # noqa: E402
from agents.runtime.testing.make_model import cached_model  # noqa: E402


def best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


SHAPES = ((2048, 768), (768, 2048), (4096, 4096), (32000, 768))  # [rows, cols] of the matrix-vector probes


def _probe_kernels(total_bytes: int, kinds: set[str] | None = None) -> dict[str, tuple[object, int]]:
    """Each read-bound probe's (function, bytes it reads), over ``total_bytes`` of data (far beyond the caches,
    like a model's weights): a reduction, and matrix-vector products over stacks of matrices of several shapes,
    with torch's kernels and (where they load) the native panels' (what the engine streams: their prefetch reads
    faster than torch's kernels on some hosts, and the machine's best is then theirs). ``kinds``: only the probes
    so named (their data alone is made), e.g. ``{"sum", "panels 4096x4096"}``; None: all."""
    def wanted(name: str) -> bool:
        return kinds is None or name in kinds

    out: dict[str, tuple[object, int]] = {}
    if wanted("sum"):
        big = torch.randn(total_bytes // 4)
        out["sum"] = (big.sum, total_bytes)
    for rows, cols in SHAPES:
        shape = f"{rows}x{cols}"
        plain, packed = wanted(f"matvec {shape}"), wanted(f"panels {shape}") and kernels.available()
        if not (plain or packed):
            continue
        copies = max(1, total_bytes // (rows * cols * 4))
        stack = [torch.randn(rows, cols) for _ in range(copies)]
        x = torch.randn(1, cols)

        def run(stack=stack, x=x) -> None:
            for w in stack:
                torch.nn.functional.linear(x, w)

        if plain:
            out[f"matvec {shape} x{copies}"] = (run, copies * rows * cols * 4)
        panels = [kernels.pack_panels(w) for w in stack] if packed else []
        if panels and all(p is not None for p in panels):

            def run_panels(panels=panels, x=x, rows=rows) -> None:
                for wp in panels:
                    kernels.panel_linear(x, wp, rows)

            out[f"panels {shape} x{copies}"] = (run_panels, copies * rows * cols * 4)
    return out


def bandwidth_probes(total_bytes: int = 256 * 1024 * 1024) -> dict[str, float]:
    """GB/s of every probe of ``_probe_kernels``, one shape's data at a time. The best is the machine's practical
    read bandwidth."""
    out: dict[str, float] = {}
    for kinds in [{"sum"}] + [{f"matvec {r}x{c}", f"panels {r}x{c}"} for r, c in SHAPES]:
        out |= {name: nbytes / best_of(fn) / 1e9 for name, (fn, nbytes) in _probe_kernels(total_bytes, kinds).items()}
    return out


def probe_beside(kinds: set[str], total_bytes: int = 256 * 1024 * 1024):
    """A function that measures the probes of ``kinds`` again (their data made once, kept) and returns the best
    GB/s."""
    kept = _probe_kernels(total_bytes, kinds)

    def measure() -> float:
        return max(nbytes / best_of(fn, 3) / 1e9 for fn, nbytes in kept.values())

    return measure


def streamed_bytes(model: torch.nn.Module) -> int:
    """Bytes read per decode token: all weights except the embedding table (one row of it is read)."""
    params = {id(p): p for p in model.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed
    return total if tied else total - embed.numel() * embed.element_size()


@torch.inference_mode()
def runtime_decode(model, prompt: list[int], tokens: int, device: str = "cpu") -> float:
    """Decode tok/s through the paged cache (prefill excluded), with a lean per-step context update. Every tensor
    is made on ``device`` by name: a ``torch.device`` context would route every op of the model through a
    Python function mode, and time that instead."""
    return _runtime_decode(model, prompt, tokens, device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _runtime_decode(model, prompt: list[int], tokens: int, device: str) -> float:
    block = 16
    max_len = len(prompt) + tokens + 1
    spec = model.kv_cache_spec()
    nblocks = -(-max_len // block)
    shape = (nblocks, block, spec.num_kv_heads, spec.head_dim)
    model.bind_kv_cache([(torch.zeros(shape, dtype=spec.dtype, device=device),
                          torch.zeros(shape, dtype=spec.dtype, device=device)) for _ in range(spec.num_layers)])
    i32 = dict(dtype=torch.int32, device=device)
    table = torch.arange(nblocks, **i32)[None]  # [1, nblocks]
    n = len(prompt)
    ctx = ForwardContext(torch.tensor([0, n], **i32), torch.tensor([n], **i32), n, n,
                         torch.arange(n, device=device), table, False)
    hidden = model.forward(torch.tensor(prompt, device=device), torch.arange(n, device=device), ctx).hidden
    nxt = model.compute_logits(hidden[-1:]).argmax(-1)  # [1]
    one = torch.tensor([0, 1], **i32)
    _sync(device)
    start = time.perf_counter()
    for step in range(tokens):
        pos = torch.tensor([n + step], device=device)
        ctx = ForwardContext(one, torch.tensor([n + step + 1], **i32), 1, n + step + 1, pos, table, True)
        hidden = model.forward(nxt, pos, ctx).hidden
        nxt = model.compute_logits(hidden).argmax(-1)
    _sync(device)
    return tokens / (time.perf_counter() - start)


@torch.inference_mode()
def transformers_decode(ref, prompt: list[int], tokens: int, device: str = "cpu", tokenizer=None) -> float:
    """Decode tok/s of ``generate`` and the decode of its new tokens to text (prefill excluded: the time of a
    1-token run is subtracted)."""
    ids = torch.tensor([prompt], device=device)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def gen(n: int) -> float:
        t = time.perf_counter()
        out = ref.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        _sync(device)
        if tokenizer is not None:
            tokenizer.decode(out[0, len(prompt):].tolist(), skip_special_tokens=True)
        return time.perf_counter() - t

    return tokens / (gen(tokens + 1) - gen(1))


@torch.inference_mode()
def engine_decode(engine, prompt: list[int], tokens: int, device: str = "cpu") -> float:
    """Decode tok/s of the engine end to end: ``generate`` (scheduler, model runner, sampler, the text of every
    step), N + 1 tokens minus 1 token, like ``transformers_decode``."""
    from agents.runtime.engine import SamplingParams

    def gen(n: int) -> float:
        t = time.perf_counter()
        out = engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0]
        _sync(device)
        assert out.num_output_tokens == n and out.text is not None
        return time.perf_counter() - t

    return tokens / (gen(tokens + 1) - gen(1))


def compare(arch: str, size: str, tokens: int, rounds: int = 3, device: str = "cpu", probe=None) -> dict:
    """Both sides on the same weights, interleaved round by round (machine noise hits both); best of each.
    ``probe``: a read-bandwidth probe run beside every engine round (a shared host's bandwidth drifts within a
    minute: the engine's best and the probe's best then come from the same stretch of time)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.runtime.engine import LLMEngine

    path = cached_model(arch, size)
    # the weights as `day0 serve` lays them out on this device (packed on a CPU in fp32)
    engine = LLMEngine(path, device=device, max_num_seqs=1, max_model_len=256 + tokens,
                       pack_weights=packs_by_default("float32", device, False))
    model = engine.model
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().to(device)
    ref_tok = AutoTokenizer.from_pretrained(path)
    prompt = list(range(16, 48))
    engine.warmup()
    engine_decode(engine, prompt, 4, device)
    transformers_decode(ref, prompt, 4, device, ref_tok)
    ours, theirs, bare, probed = 0.0, 0.0, 0.0, 0.0
    for _ in range(rounds):
        probed = max(probed, probe() if probe is not None else 0.0)
        ours = max(ours, engine_decode(engine, prompt, tokens, device))
        probed = max(probed, probe() if probe is not None else 0.0)
        theirs = max(theirs, transformers_decode(ref, prompt, tokens, device, ref_tok))
    # the bare loop binds its own cache to the model: after the engine's rounds, never between them
    runtime_decode(model, prompt, 4, device)
    for _ in range(rounds):
        bare = max(bare, runtime_decode(model, prompt, tokens, device))
    return {"model": f"{arch}-{size}", "bytes": streamed_bytes(model), "ours": ours, "transformers": theirs,
            "bare": bare, "probed": probed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-mixtral", action="store_true")
    ap.add_argument("--device", default="cpu", help="torch device of both sides (cpu, cuda); the probes stay on CPU")
    ap.add_argument("--bind-threads", action="store_true",
                    help="pin this process's compute threads one to a core first, as day0 serve does when its "
                         "threads are the host's CPUs (the probes and both sides run on the same pinned team)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    said = "not pinned"
    if args.bind_threads:
        from agents.runtime.threads import bind_engine_threads

        said = bind_engine_threads(True)
    print(f"threads: {torch.get_num_threads()} ({said})")
    probes = bandwidth_probes()
    for name, gbs in probes.items():
        print(f"  probe {name:<22} {gbs:7.2f} GB/s")
    # the best two kinds again beside every engine round: the best read bandwidth is the best of all of them
    fastest = sorted(probes, key=probes.get)[-1]
    beside = probe_beside({"sum", fastest.rsplit(" x", 1)[0]})  # its kind, without the copy count
    packed = packs_by_default("float32", args.device, False)
    print(f"device: {args.device}; engine weights: {pack_layout() + ' packed' if packed else 'plain'} (as day0 serve)")
    rows = [compare("llama", "100m", args.tokens, device=args.device, probe=beside)]
    if not args.skip_mixtral:
        rows.append(compare("mixtral", "tiny", args.tokens * 4, device=args.device))
    best = max(max(probes.values()), *(r["probed"] for r in rows))
    print(f"  best read bandwidth        {best:7.2f} GB/s (the probes above, and {fastest} and sum beside every "
          f"engine round: best {max(r['probed'] for r in rows):.2f})")
    print(f"\n{'model':<14}{'engine tok/s':>14}{'transformers tok/s':>20}{'ratio':>8}{'engine GB/s':>13}"
          f"{'transformers GB/s':>19}{'% of best':>11}{'bare loop tok/s':>17}")
    for r in rows:
        ours_bw, theirs_bw = r["bytes"] * r["ours"] / 1e9, r["bytes"] * r["transformers"] / 1e9
        print(f"{r['model']:<14}{r['ours']:>14.1f}{r['transformers']:>20.1f}{r['ours'] / r['transformers']:>8.2f}"
              f"{ours_bw:>13.2f}{theirs_bw:>19.2f}{100 * ours_bw / best:>10.1f}%{r['bare']:>17.1f}")
    print("\nboth sides: wall time of a request of N + 1 tokens minus one of 1 token (engine: scheduler, sampler and "
          "text every step; transformers: generate, then its tokens decoded to text)")
    print("targets: llama-100m ratio >= 1.0 and >= 85 % of best; mixtral-tiny ratio >= 2.0")


if __name__ == "__main__":
    main()
