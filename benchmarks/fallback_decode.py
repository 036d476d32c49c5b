"""The transformers fallback's decode: the paged path (the runtime's KV cache, continuous batching, chunked prefill)
against the recompute path it replaces (the whole sequence every step, one request at a time), on the same
random-weight model of a family the runtime has no native code for (Gemma-3 text, the 270M shape by default).

Printed: TPOT at a short and a long prompt (mean gap between a request's tokens after its first), and output tok/s
at 1 and 4 concurrent requests (short prompts, all submitted at once, wall time to the last token), each path side
by side, with the goal (TPOT nearly flat in context length, tok/s that scales with concurrency).

    .venv/bin/python benchmarks/fallback_decode.py [--shape 270m|small] [--threads N] [--tokens 32] [--long 1024]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agents.runtime.engine import LLMEngine, SamplingParams  # noqa: E402

SHAPES = {  # Gemma-3 text: five sliding-window layers to one global
    "270m": {"hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144, "sliding_window": 512},
    "small": {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
              "head_dim": 64, "intermediate_size": 768, "vocab_size": 32000, "sliding_window": 512},
}


class _Ids:
    """Prompts as token ids, nothing detokenised: the benchmark times the model and the engine."""

    eos_token_ids: set[int] = set()

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab

    def encode(self, prompt, add_special_tokens=True):  # noqa: ANN001, ANN201, ARG002
        return list(prompt)

    def special_ids(self) -> list[int]:
        return []

    def decode(self, ids, **_):  # noqa: ANN001, ANN003, ANN201
        return ""


def build(shape: str, root: Path) -> Path:
    import transformers

    out = root / f"gemma3-{shape}"
    if (out / "config.json").exists():
        return out
    layers = SHAPES[shape]["num_hidden_layers"]
    cfg = transformers.Gemma3TextConfig(**SHAPES[shape], max_position_embeddings=4096, bos_token_id=2,
                                        eos_token_id=1, pad_token_id=0,
                                        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                                     for i in range(layers)])
    torch.manual_seed(0)
    transformers.Gemma3ForCausalLM(cfg).save_pretrained(out)
    return out


def engine_for(model_dir: Path, paged: bool, max_len: int) -> LLMEngine:
    from agents.runtime.loader import load_model

    result = load_model(model_dir, dtype="float32")
    result.model.recompute_only = not paged
    engine = LLMEngine(None, model=result.model, config=result.config, tokenizer=_Ids(result.config["vocab_size"]),
                       max_num_seqs=8, max_model_len=max_len, num_blocks=8 * (-(-max_len // 16)))
    assert result.model.decode_path == ("paged" if paged else "recompute"), result.model.decode_reason
    return engine


def run(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """(mean TPOT in ms over the requests, output tok/s over the wall time)."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    stamps: dict[str, list[float]] = {i: [] for i in ids}
    done = 0
    while done < len(ids):
        for out in engine.step():
            if out.new_token_ids:
                stamps[out.request_id].append(time.perf_counter())
            done += out.finished
    wall = time.perf_counter() - start
    tpot = sum((s[-1] - s[0]) / (len(s) - 1) for s in stamps.values()) / len(stamps)
    return tpot * 1e3, len(ids) * tokens / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="270m")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--short", type=int, default=32, help="tokens of the short prompt")
    parser.add_argument("--long", type=int, default=1024, help="tokens of the long prompt")
    parser.add_argument("--paths", default="recompute,paged", help="which paths to time, in order")
    parser.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "day0-fallback-bench"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = build(args.shape, Path(args.models))
    gen = torch.Generator().manual_seed(0)
    vocab = SHAPES[args.shape]["vocab_size"]

    def prompt(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    short, long_ = prompt(args.short), prompt(args.long)
    shorts = [prompt(args.short) for _ in range(4)]
    rows: dict[str, dict[str, float]] = {}
    for path in args.paths.split(","):
        engine = engine_for(model_dir, path == "paged", args.long + args.tokens + 16)
        engine.generate([prompt(8)], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # warm-up
        tpot_short, tok1 = run(engine, [short], args.tokens)
        tpot_long, _ = run(engine, [long_], args.tokens)
        _, tok4 = run(engine, shorts, args.tokens)
        rows[path] = {"short": tpot_short, "long": tpot_long, "tok1": tok1, "tok4": tok4}
        print(f"  {path}: done", flush=True)
    print(f"\nGemma-3 text {args.shape} (random weights, fp32, CPU, {args.threads} threads), {args.tokens} new tokens")
    print(f"{'metric':<34}" + "".join(f"{p:>12}" for p in rows) + "   goal")
    lines = [(f"TPOT ms, {args.short}-token prompt", "short", "—"),
             (f"TPOT ms, {args.long}-token prompt", "long", "nearly flat: long ≈ short"),
             ("output tok/s, 1 request", "tok1", "—"),
             ("output tok/s, 4 concurrent", "tok4", "scales with concurrency")]
    for label, key, goal in lines:
        print(f"{label:<34}" + "".join(f"{r[key]:>12.1f}" for r in rows.values()) + f"   {goal}")
    for path, r in rows.items():
        print(f"{path}: long/short TPOT {r['long'] / r['short']:.2f}x, 4-request/1-request tok/s "
              f"{r['tok4'] / r['tok1']:.2f}x")


if __name__ == "__main__":
    main()
