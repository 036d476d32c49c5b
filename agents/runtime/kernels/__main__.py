"""``python -m agents.runtime.kernels build [--out DIR]``: the kernels' library built ahead of time, so that a
serving host needs no compiler (it loads ``DIR/day0_cpu_kernels.so``; point ``DAY0_KERNEL_PREBUILT`` at DIR when DIR
is not the kernel cache)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agents.runtime.kernels import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.runtime.kernels",
                                     description="The runtime's native CPU kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="write the shared library once, for hosts without a C compiler")
    make.add_argument("--out", type=Path, default=None,
                      help=f"folder to write {build.PREBUILT_NAME} in (default: ${build.PREBUILT_ENV}, else the "
                           "kernel cache)")
    args = parser.parse_args(argv)
    try:
        target = build.build_prebuilt(args.out)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
