"""``day0 serve MODEL_DIR``: the OpenAI-compatible server on a model directory."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable
from pathlib import Path

# the tool-call formats (agents/runtime/server/tool_parsers), named here so that --help needs no server import
PARSER_NAMES = ("deepseek_v3", "hermes", "kimi_k2", "llama3_json", "mistral", "qwen")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model_dir", help="model directory (config.json, safetensors, tokenizer)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (processes on this host)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (pp x max(tp, ep) processes)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree inside a stage")
    p.add_argument("--nnodes", type=int, default=1, help="hosts the ranks span (torchrun convention; default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this host's node rank; node 0 serves HTTP")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node 0, where the ranks rendezvous")
    p.add_argument("--master-port", type=int, default=29500, help="rendezvous port on node 0 (default 29500)")
    p.add_argument("--rendezvous-timeout", type=float, default=300.0,
                   help="seconds for every node to join; then the missing node is named (default 300)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--num-blocks", type=int, default=None, help="KV-cache blocks (default: from free memory)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--memory-fraction", type=float, default=None, help="share of free memory for the KV cache")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget of one step: decodes first, then prefill chunks (default 2048, as vLLM-CPU)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="share the KV blocks of repeated prompt prefixes between requests (vLLM's flag; default "
                        "off: Day-0 benchmarks repeat prompts and must measure compute, not cache lookups)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--chat-template", default=None, metavar="PATH",
                   help="a Jinja chat template file served instead of the model's own (its text, as transformers "
                        "reads it); requests may pass variables to it in 'chat_template_kwargs'")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $DAY0_API_KEY; /health stays open)")
    p.add_argument("--allowed-origins", default="",
                   help="comma-separated CORS origins allowed to call the API ('*' for any; default: none)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body in MiB (default 8)")
    p.add_argument("--allow-remote-images", action="store_true",
                   help="fetch http(s) image URLs in chat messages (default: refused; send data: URLs)")
    p.add_argument("--max-images", type=int, default=8, help="images per chat request (default 8)")
    p.add_argument("--compile", action="store_true",
                   help="compile the decoder layers with torch.compile (Inductor, dynamic token counts); "
                        "evidence at /stats/compile")
    p.add_argument("--compile-cache", default=None,
                   help="Inductor's cache directory (default: $DAY0_COMPILE_CACHE_DIR, else var/compile-cache)")
    p.add_argument("--quant-mode", default="auto", choices=["auto", "native", "emulated"],
                   help="how an FP8 per-tensor/per-channel release runs: 'native' keeps its weights in FP8 and "
                        "multiplies W8A8 (torch._scaled_mm, activations quantized per token); 'emulated' "
                        "dequantizes at load; 'auto' (default) is native where the device has FP8 (CUDA compute "
                        "capability 8.9+). Other quantized formats run emulated; 'native' refuses them")
    p.add_argument("--pack-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="pack the layers' fp32 CPU weights once, in place: into the native kernels' panels "
                        "(batch-1 decode ~1.4x faster, batched products at oneDNN's rate), or oneDNN's blocked "
                        "layout where the kernels are not built (DAY0_PACK_LAYOUT=onednn asks for it) (default: on "
                        "for fp32 on CPU unless --compile)")
    p.add_argument("--bind-threads", action=argparse.BooleanOptionalAction, default=None,
                   help="CPU serving: pin each compute thread to one core (16 requests at once ~8 %% faster beside "
                        "a benchmark client on a 2-core host; batch 1 within the noise); default: pinned when the threads (OMP_NUM_THREADS, DAY0_TORCH_THREADS) "
                        "are exactly the CPUs this process may use; with --tp/--pp/--ep the ranks on a host split its CPUs "
                        "(one thread per CPU of a rank's own share) and each is pinned to its share")
    p.add_argument("--allocator", default="auto", choices=["auto", "tcmalloc", "system"],
                   help="CPU serving: 'auto' re-executes once with tcmalloc preloaded when the host has it "
                        "(5x fewer page faults per decode step than glibc malloc) and huge pages for torch's large "
                        "tensors; 'tcmalloc' insists; 'system' keeps glibc malloc (default auto)")
    p.add_argument("--tool-call-parser", default="auto",
                   help="how tool calls are read from the output: " + ", ".join(sorted(PARSER_NAMES)) + ", 'auto' "
                        "(chosen from the chat template; default) or 'none'")
    p.add_argument("--reasoning-parser", default="auto", choices=["auto", "deepseek_r1", "qwen3", "none"],
                   help="split <think>...</think> into reasoning_content: 'auto' (from the chat template; default)")
    p.set_defaults(handler=handle)


def serve_command(model_dir: Path | str, *, dtype: str, device: str, port: int | None = None,
                  args: Iterable[object] = (), tool_call_parser: str | None = None,
                  reasoning_parser: str | None = None) -> list[str]:
    """The argv that starts this command in a child process, as the runtime's own module (``python -m
    agents.runtime serve``, not through the Django project's package): the model, ``--port`` when given,
    ``--dtype``, ``--device``, ``--tool-call-parser`` / ``--reasoning-parser`` when given, then ``args`` in order (a
    later repeat of a flag wins, as argparse reads it). Run it with the repository root as the working directory."""
    parsers = [*(["--tool-call-parser", tool_call_parser] if tool_call_parser else []),
               *(["--reasoning-parser", reasoning_parser] if reasoning_parser else [])]
    return [sys.executable, "-m", "agents.runtime", "serve", str(model_dir),
            *(["--port", str(port)] if port is not None else []), "--dtype", dtype, "--device", device,
            *parsers, *(str(a) for a in args)]


def packs_by_default(dtype: str, device: str, compile_: bool) -> bool:
    """``--pack-weights`` unset: fp32 serving on a CPU packs (measured on 2-core AVX-512 hosts: the native panels
    decode at one row 1.3-1.5x faster than the plain or oneDNN layout and match oneDNN's batched GEMMs, which
    are 1.4-1.7x the plain layout's at 2-64 rows); the compiled path traces plain weights, and other dtypes and
    devices have nothing to pack."""
    return dtype == "float32" and device.startswith("cpu") and not compile_


def handle(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"day0 serve: {args.model_dir} is not a model directory (no config.json)", flush=True)
        return 2
    if args.device.startswith("cpu"):
        from agents.runtime import allocator

        try:
            env, said = allocator.plan(args.allocator)
        except ValueError as exc:
            print(f"day0 serve: {exc}", flush=True)
            return 2
        if env is not None and getattr(args, "process_argv", False):  # a preload needs a fresh process
            logging.getLogger(__name__).info("allocator: %s; re-executing once to preload it", said)
            allocator.reexec_with(env)
            said = "system malloc (the re-exec for tcmalloc failed)"
        elif env is not None:
            said = "system malloc (called in-process: no re-exec)"
        logging.getLogger(__name__).info("allocator: %s", said)
    for flag, value in (("--tp", args.tp), ("--pp", args.pp), ("--ep", args.ep)):
        if value < 1:
            print(f"day0 serve: {flag} must be >= 1, got {value}", flush=True)
            return 2
    if not 0.001 <= args.max_body_mb <= 1024:
        print(f"day0 serve: --max-body-mb must be in [0.001, 1024], got {args.max_body_mb}", flush=True)
        return 2
    if args.tool_call_parser not in ("auto", "none", *PARSER_NAMES):
        print(f"day0 serve: --tool-call-parser must be auto, none or one of {', '.join(sorted(PARSER_NAMES))}",
              flush=True)
        return 2
    if args.max_images < 1:
        print(f"day0 serve: --max-images must be >= 1, got {args.max_images}", flush=True)
        return 2
    if args.pack_weights and args.compile:
        print("day0 serve: --pack-weights and --compile exclude each other", flush=True)
        return 2
    if args.pack_weights is None:
        args.pack_weights = packs_by_default(args.dtype, args.device, args.compile)
    if args.compile:
        from agents.runtime.engine.compiled import CompileUnavailable, check_cpp_compiler

        if args.tp > 1 or args.pp > 1 or args.ep > 1:
            print("day0 serve: --compile serves one process for now (--tp, --pp and --ep 1)", flush=True)
            return 2
        try:
            compiler = check_cpp_compiler() if args.device.startswith("cpu") else None
        except CompileUnavailable as exc:
            print(f"day0 serve: --compile: {exc}", flush=True)
            return 2
        logging.getLogger(__name__).info("compiled path on; C++ compiler %s", compiler or "not needed")
    template = None
    if args.chat_template is not None:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"day0 serve: --chat-template: cannot read {args.chat_template}: {exc}", flush=True)
            return 2
        import jinja2

        try:
            jinja2.Environment().parse(template)
        except jinja2.TemplateSyntaxError as exc:
            print(f"day0 serve: --chat-template: {args.chat_template} does not parse: {exc} (line {exc.lineno})",
                  flush=True)
            return 2
    origins = [o.strip() for o in args.allowed_origins.split(",") if o.strip()]
    from agents.runtime.nodes import NodeSpec, node_layout_problem
    from agents.runtime.server.images import ImageLimits
    from agents.runtime.server.launcher import serve

    try:
        node = NodeSpec(args.nnodes, args.node_rank, args.master_addr, args.master_port, args.rendezvous_timeout)
        problem = node_layout_problem(json.loads((Path(args.model_dir) / "config.json").read_text()),
                                      args.tp, args.pp, args.ep, node)
    except ValueError as exc:
        problem = str(exc)
    if problem:
        print(f"day0 serve: {problem}", flush=True)
        return 2
    run = serve
    if args.tp > 1 or args.pp > 1 or args.ep > 1:
        from functools import partial

        from agents.runtime.engine.tp import serve_tp

        run = partial(serve_tp, tp=args.tp, pp=args.pp, ep=args.ep, node=node if node.multi else None)
    return run(
        args.model_dir,
        host=args.host,
        port=args.port,
        model_name=args.served_model_name,
        api_key=args.api_key,
        allowed_origins=origins,
        max_body_bytes=int(args.max_body_mb * 2**20),
        image_limits=ImageLimits(max_images=args.max_images, allow_remote=args.allow_remote_images),
        dtype=args.dtype,
        device=args.device,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        memory_fraction=args.memory_fraction,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        quant_mode=args.quant_mode,
        **({"compile": True, "compile_cache_dir": args.compile_cache} if args.compile else {}),
        **({"pack_weights": True} if args.pack_weights else {}),
        **({"chat_template": template} if template is not None else {}),
        bind_threads=args.bind_threads,
        tool_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
    )
