"""`day0 adapt`: run pipeline stages standalone (no portal) and write the stage report (docs/stage-report.md);
`day0 manifest`: print the checksum manifest of a checkpoint's weight files (what ``--manifest`` takes)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from contract.tiers import DEFAULT_STAGES, STAGE_ORDER


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "adapt",
        help="run the adaptation pipeline on a model directory and write the stage report",
        description=__doc__,
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR",
                        help="a model directory (config.json, safetensors, tokenizer) or a config.json alone")
    parser.add_argument("--hardware", required=True, metavar="SLUG", help="hardware slug of the catalog, or cpu")
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                        help=f"comma-separated, run in pipeline order; of {','.join(STAGE_ORDER)}")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cpu", help="torch device of the target (default cpu)")
    parser.add_argument("--quant-mode", default="auto", choices=("auto", "native", "emulated"),
                        help="how an FP8 per-tensor/per-channel release runs: 'native' keeps its weights in FP8 and "
                             "multiplies W8A8 (torch._scaled_mm); 'emulated' dequantizes at load; 'auto' (default) "
                             "is native where --hardware declares float8 or the device has FP8. Other quantized "
                             "formats run emulated, and 'native' refuses them (docs/quantized.md)")
    parser.add_argument("--tp", type=int, default=None, help="pin the plan's tensor-parallel degree")
    parser.add_argument("--ep", type=int, default=None, help="pin the plan's expert-parallel degree")
    parser.add_argument("--pp", type=int, default=None, help="pin the plan's pipeline stages")
    parser.add_argument("--nnodes", type=int, default=1,
                        help="hosts the job's ranks span (torchrun convention); every node runs day0 adapt")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="this host's node rank: node 0 runs the pipeline and writes the report, the others "
                             "run their ranks of the load, serve and comm stages")
    parser.add_argument("--master-addr", default="127.0.0.1", help="address of node 0, where the ranks meet")
    parser.add_argument("--master-port", type=int, default=29500,
                        help="first rendezvous port on node 0 (load +0, serve +1, comm +2)")
    parser.add_argument("--rendezvous-timeout", type=float, default=300.0,
                        help="seconds for every node to join a stage's ranks; then the missing node is named")
    parser.add_argument("--compile", action="store_true",
                        help="take the compiled path (a job's bench.compile: true): align compares compiled and eager "
                             "greedy tokens, serve starts `day0 serve --compile`, bench compares it with eager; a "
                             "model that cannot take it runs eager and each section's compile key says why")
    parser.add_argument("--engine", default=None, metavar="NAME[@VERSION]",
                        help="serve through this engine started by --engine-command (default: day0, the bundled "
                             "runtime); inventory and align are then not applicable")
    parser.add_argument("--engine-command", default=None, metavar="TEMPLATE",
                        help="the engine's launch command, with {model_path} {port} {dtype} {tp} {pp} {ep} "
                             "{max_model_len} {extra}")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE", help="write the report JSON here")
    parser.add_argument("--threshold", action="append", default=[], metavar="KEY=VALUE",
                        help="override a threshold, e.g. layer_cosine=0.995 (repeatable)")
    parser.add_argument("--workdir", type=Path, default=Path("var/adapt"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    parser.add_argument("--manifest", type=Path, default=None, metavar="FILE",
                        help="the release's checksum manifest (JSON, as `day0 manifest` prints it): the load stage "
                             "fails naming any shard whose sha256 or size differs, or that is missing or extra")
    parser.add_argument("--original", type=Path, default=None, metavar="DIR",
                        help="a quantised release's unquantised original: align adds the quantisation's cost against "
                             "it (e2e_original; default: DIR/original beside the release when it exists)")
    parser.set_defaults(handler=handle)
    manifest = subparsers.add_parser(
        "manifest", help="print the checksum manifest [{name, size, sha256}] of a checkpoint's weight files",
        description="Hash every weight file of MODEL_DIR (the shards its safetensors index names, or "
                    "model.safetensors) and print the manifest as JSON.")
    manifest.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    manifest.add_argument("--out", type=Path, default=None, metavar="FILE", help="write it here instead of stdout")
    manifest.set_defaults(handler=handle_manifest)


def handle_manifest(args: argparse.Namespace) -> int:
    """``day0 manifest MODEL_DIR``: the manifest on stdout (or ``--out``); 2 with a message when unreadable."""
    from agents.runtime.loader import LoadError
    from agents.runtime.loader.manifest import build_manifest

    try:
        manifest = build_manifest(args.model_dir)
    except (LoadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(manifest, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """The manifest in ``path`` as ``[{name, size, sha256}]``; a ValueError names the file and what is wrong."""
    from agents.runtime.loader.manifest import parse_manifest

    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--manifest {path}: cannot read it: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--manifest {path}: not valid JSON: {exc}") from None
    try:
        entries = parse_manifest(data)
    except ValueError as exc:
        raise ValueError(f"--manifest {path}: {exc}") from None
    return [{"name": e.name, "size": e.size, "sha256": e.sha256} for e in entries.values()]


def parse_thresholds(items: list[str]) -> dict[str, float]:
    """``["key=value", …]`` -> {key: float}; a malformed item or an unknown key is a ValueError naming it."""
    from agents.pipeline.runner import check_thresholds

    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--threshold {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return check_thresholds(out)


class ConsoleEmitter:
    """Prints stage events; progress at most once a second per stage (and when a stage's work completes)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._last: dict[str, float] = {}

    def __call__(self, kind: str, message: str, *, level: str = "info", data: dict | None = None,
                 stage: str = "") -> None:
        if kind == "result":
            return
        if level == "error" and kind == "log":
            print(message, file=sys.stderr, flush=True)
            return
        if self.quiet:
            return
        if kind == "progress":
            data = data or {}
            now = time.monotonic()
            if data.get("done") != data.get("total") and now - self._last.get(stage, 0.0) < 1.0:
                return
            self._last[stage] = now
        print(f"[{stage or '-':>9}] {message}", flush=True)


def _load_job(model_arg: Path) -> tuple[Path | None, dict[str, Any]]:
    """(model_dir or None for a config alone, parsed config.json)."""
    if model_arg.is_file():
        config_path, model_dir = model_arg, None
    elif model_arg.is_dir():
        config_path, model_dir = model_arg / "config.json", model_arg
    else:
        raise ValueError(f"{model_arg} does not exist")
    if not config_path.is_file() and model_dir is not None:
        from agents.runtime.loader import LoadError
        from agents.runtime.loader.gguf_release import release_config

        try:  # a GGUF-only release: its config from the file's metadata
            config = release_config(model_dir)
        except LoadError as exc:
            raise ValueError(str(exc)) from None
        if config is not None:
            return model_dir, config
    if not config_path.is_file():
        raise ValueError(f"{model_arg} has no config.json (nor a single .gguf)")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} does not hold a JSON object")
    return model_dir, config


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The human summary printed after a run."""
    lines = [f"model {report['model'].get('name')} ({report['model'].get('architecture')}, "
             f"{report['model'].get('path') or 'path unknown'}) on {report['hardware']}, {report['dtype']}"]
    for stage in report.get("stages_requested", []):
        if stage in report["stages"] and stage != report["failed_stage"]:
            state = "passed"
        elif stage == report["failed_stage"]:
            state = "FAILED"
        else:
            state = "not run"
        secs = report["seconds"].get(stage)
        lines.append(f"  {stage:<10} {state}" + (f"  {secs:.1f} s" if secs is not None else ""))
    lines.append(f"tier {report['tier']} ({report['tier_name']})")
    if report["failed_stage"]:
        lines.append(f"failed at {report['failed_stage']}: {report['error']}")
    lines += [f"note: {note}" for note in report.get("notes", [])]
    return lines


def engine_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The job's engine from ``--engine NAME[@VERSION]`` and ``--engine-command`` (None: the bundled runtime);
    a ValueError names what is wrong."""
    from contract.engines import DEFAULT_ENGINE, check_spec_engine, parse_ref

    ref = getattr(args, "engine", None)
    command = getattr(args, "engine_command", None)
    if not ref:
        if command:
            raise ValueError("--engine-command needs --engine NAME[@VERSION]")
        return None
    name, version = parse_ref(ref)
    if name == DEFAULT_ENGINE:
        return None
    if not command:
        raise ValueError(f"--engine {ref} needs --engine-command (standalone, the catalog's templates are the portal's)")
    return check_spec_engine({"name": name, "version": version or "", "command": command})


def handle(args: argparse.Namespace) -> int:
    from agents.pipeline.runner import parse_stages, run_pipeline
    from agents.pipeline.support.context import StageContext

    try:
        stages = parse_stages(args.stages)
        thresholds = parse_thresholds(args.threshold)
        model_dir, config = _load_job(args.model_dir)
        manifest = read_manifest(args.manifest) if args.manifest is not None else None
        for name, value in (("--tp", args.tp), ("--ep", args.ep), ("--pp", args.pp), ("--threads", args.threads)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        from contract.hardware import get_hardware

        try:
            hardware = get_hardware(args.hardware).to_dict()
        except KeyError as exc:
            raise ValueError(str(exc.args[0]) if exc.args else f"unknown hardware {args.hardware!r}") from None
        node = node_of(args, config)
        if args.original is not None and not (args.original / "config.json").is_file():
            raise ValueError(f"--original {args.original}: no config.json there")
        engine = engine_of(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    ctx = StageContext(model_dir=model_dir, config=config, hardware=hardware, dtype=args.dtype, device=args.device,
                       quant_mode=args.quant_mode,
                       tp=args.tp, ep=args.ep, pp=args.pp, thresholds=thresholds, workdir=args.workdir, manifest=manifest,
                       original_dir=args.original, emit_fn=ConsoleEmitter(args.quiet), node=node, bench={"compile": True} if args.compile else {}, engine=engine)
    if model_dir is None:  # a config alone: name the model after its file (deepseek-v3.json -> deepseek-v3)
        ctx.state.model_name = args.model_dir.stem
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    def on_sigint(_sig: int, _frame: Any) -> None:
        # first Ctrl-C: stop between steps and still write the report; second: abort at once
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("cancelling after the current step (Ctrl-C again to abort)", file=sys.stderr, flush=True)
        ctx.cancel_event.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        if node is not None and node.node_rank > 0:
            return _follow(ctx, stages, args.report)
        report = run_pipeline(ctx, stages)
    finally:
        signal.signal(signal.SIGINT, previous)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        partial = args.report.with_name(args.report.name + ".partial")
        partial.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        partial.replace(args.report)  # readers never see half a report
    print("\n".join(summary_lines(report)), flush=True)
    if args.report is not None:
        print(f"report written to {args.report}")
    return 1 if report["failed_stage"] else 0


def node_of(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    """The ``NodeSpec`` of ``--nnodes …`` (None on one host); ValueError naming a bad flag, or the planner's
    rule a multi-node layout (``--tp/--pp/--ep``, default 1) breaks."""
    from agents.runtime.nodes import NodeSpec, node_layout_problem

    node = NodeSpec(args.nnodes, args.node_rank, args.master_addr, args.master_port, args.rendezvous_timeout)
    if not node.multi:
        return None
    problem = node_layout_problem(config, args.tp or 1, args.pp or 1, args.ep or 1, node)
    if problem:
        raise ValueError(f"--nnodes {node.nnodes}: {problem}")
    return node


def _follow(ctx: Any, stages: list[str], report_path: Path | None) -> int:
    """A node other than 0: run its ranks of each ranked stage; 1 when one failed."""
    from agents.pipeline.follower import follow

    outcome = follow(ctx, stages)
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(outcome, indent=2) + "\n")
    ran = ", ".join(f"{s} {'ok' if r['ok'] else 'FAILED'}" for s, r in outcome["stages"].items()) or "no ranked stage"
    print(f"node {outcome['node']} of {outcome['nnodes']}: {ran}", flush=True)
    if outcome["failed_stage"]:
        print(f"failed at {outcome['failed_stage']}: {outcome['error']}", file=sys.stderr, flush=True)
        return 1
    return 0
