"""`day0 estimate CONFIG`: parameters, weight and KV bytes, and the smallest TP × PP × EP plan that fits, from a
config alone. CONFIG is a config.json path, a model directory, or a bundled catalog slug (e.g. deepseek-v3)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

GB = 1e9
GIB = 1 << 30


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("estimate", help="plan a model on a hardware from its config alone",
                                   description=__doc__,
                                   epilog="exit status: 0 fits, 1 does not fit, 2 bad input")
    parser.add_argument("config", metavar="CONFIG", help="config.json, a model directory, or a catalog slug")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--hardware", metavar="SLUG", help="a hardware slug of the catalog, or 'cpu' for this host")
    target.add_argument("--memory-gb", type=float, metavar="N", help="memory per device in GB (10^9 bytes)")
    parser.add_argument("--devices-per-node", type=int, metavar="N",
                        help="devices per node (default: the hardware's, or 8 with --memory-gb)")
    parser.add_argument("--dtype", default="bfloat16",
                        help="weight dtype: float32, bfloat16, float16, fp8, int8, int4, mxfp4, or auto (the "
                             "checkpoint's own format); default bfloat16")
    parser.add_argument("--max-nodes", type=int, default=16, metavar="N", help="largest plan to consider (16)")
    parser.add_argument("--tp", type=int, help="pin the tensor-parallel degree")
    parser.add_argument("--pp", type=int, help="pin the pipeline-parallel degree")
    parser.add_argument("--ep", type=int, help="pin the expert-parallel degree")
    parser.add_argument("--json", action="store_true", help="print the plan section of the stage report as JSON")
    parser.set_defaults(handler=handle)


def resolve_config(value: str) -> tuple[dict[str, Any], str]:
    """(config dict, where it came from). ValueError naming the CONFIG argument when it is none of the three."""
    from contract.hardware import find_config, load_model_catalog

    path = Path(value)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"model directory {value} has no config.json")
    if path.is_file():
        try:
            return json.loads(path.read_text()), str(path)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    config = find_config(value.lower())
    if config is not None:
        return config, f"catalog:{value.lower()}"
    for row in load_model_catalog():
        if value.lower() in (row["hf_repo"].lower(), row["name"].lower()):
            return row["config"], f"catalog:{row['slug']}"
    raise ValueError(f"CONFIG {value!r} is not a file, a model directory or a catalog slug "
                     f"(catalog: {', '.join(row['slug'] for row in load_model_catalog())})")


def _gb(n: float | int | None) -> str:
    return "-" if n is None else f"{n / GIB:,.2f} GiB"


def format_report(report: dict[str, Any], source: str, target: str) -> str:
    """The human-readable table."""
    spec = report["spec"]
    kv_kind = "MLA latent" if spec["kv_lora_rank"] else f"{spec['num_kv_heads']} KV heads × {spec['head_dim']}"
    lines = [
        f"model        {source}: {report['architecture']} (family {report['family']}), {spec['num_layers']} layers, "
        f"hidden {spec['hidden_size']}, context {report['context_length']:,}",
        f"parameters   {report['params_total'] / 1e9:,.3f} B total, {report['params_active'] / 1e9:,.3f} B active",
        f"weights      {_gb(report['weight_bytes'])} at {report['dtype']}",
        f"KV cache     {report['kv_bytes_per_token']:,} bytes per token ({kv_kind})",
        f"hardware     {target}: {_gb(report['memory_per_device'])} per device, "
        f"{report['devices_per_node']} per node, headroom {report['headroom']:.0%}",
    ]
    runtime = report.get("runtime") or {}
    if runtime:
        why = f" ({runtime['reason']})" if runtime.get("reason") else ""
        lines.append(f"runtime      {runtime['path']}{why}: {runtime['layouts']}")
    plan = report["plan"]
    if plan is None:
        lines.append(f"plan         none: {report.get('message', '')}")
    else:
        verdict = "fits" if report["fits"] else "DOES NOT FIT"
        lines.append(f"plan         tp={plan['tp']} pp={plan['pp']} ep={plan['ep']}: {plan['devices']} device(s) on "
                     f"{plan['nodes']} node(s) — {verdict}")
        b = report["breakdown"]
        lines.append(f"per device   {_gb(report['bytes_per_device'])} needed of {_gb(report['usable_per_device'])} "
                     f"usable: weights {_gb(b['weights'])}, activations {_gb(b['activations'])}, comm "
                     f"{_gb(b['comm_buffers'])}, overhead {_gb(b['overhead'])}, KV pool {_gb(b['kv_pool'])}")
        if report["fits"]:
            lines.append(f"longest      {report['max_context']:,} tokens of context, batch {report['max_batch']} at "
                         f"that length ({report['kv_tokens']:,} KV tokens in all)")
            pairs = " · ".join(f"{row['context']:,} × {row['batch']}" for row in report["context_batch"])
            lines.append(f"context×batch {pairs}")
        else:
            lines.append(f"shortfall    {report['message']}")
    lines += ["", "candidates (best per device count)",
              f"{'devices':>8} {'nodes':>5} {'tp':>3} {'pp':>3} {'ep':>4} {'GiB/device':>10} {'usable':>8} "
              f"{'fits':>5} {'max_context':>12} {'max_batch':>9}"]
    for c in report["candidates"]:
        lines.append(f"{c['devices']:>8} {c['nodes']:>5} {c['tp']:>3} {c['pp']:>3} {c['ep']:>4} "
                     f"{c['bytes_per_device'] / GIB:>10.2f} {c['usable_per_device'] / GIB:>8.2f} "
                     f"{'yes' if c['fits'] else 'no':>5} {c['max_context']:>12,} {c['max_batch']:>9}")
    lines += [f"warning      {w}" for w in report["warnings"]]
    return "\n".join(lines)


def handle(args: argparse.Namespace) -> int:
    from contract.hardware import get_hardware
    from contract.model.spec import SpecError
    from contract.planner import plan_report

    try:
        config, source = resolve_config(args.config)
        if args.hardware:
            hw = get_hardware(args.hardware)
            memory, per_node, shared, dtypes = hw.memory_bytes, hw.devices_per_node, hw.shared_memory, hw.dtypes
            target = hw.slug
        else:
            if args.memory_gb <= 0:
                raise ValueError(f"--memory-gb must be positive, got {args.memory_gb}")
            memory, per_node, shared, dtypes = int(args.memory_gb * GB), 8, False, None
            target = f"{args.memory_gb:g} GB devices"
        if args.devices_per_node is not None:
            if args.devices_per_node <= 0:
                raise ValueError(f"--devices-per-node must be positive, got {args.devices_per_node}")
            per_node = args.devices_per_node
        for name in ("tp", "pp", "ep", "max_nodes"):
            value = getattr(args, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
        report = plan_report(config, memory_bytes=memory, devices_per_node=per_node, dtype=args.dtype,
                             max_nodes=args.max_nodes, shared_memory=shared, tp=args.tp, pp=args.pp, ep=args.ep,
                             hardware_dtypes=dtypes)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    except (SpecError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2) if args.json else format_report(report, source, target)
    try:
        print(text)
    except BrokenPipeError:  # `day0 estimate … | head`: the reader left, nothing more to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 — keeps the interpreter's final flush quiet
    return 0 if report["fits"] else 1
