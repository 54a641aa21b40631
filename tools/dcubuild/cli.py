"""The command line of build.sh (``python -m tools.dcubuild``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .common import REPO, BuildError, log
from .edit import refresh
from .series import check_headers, load_series, select
from .source import build_source
from .tree import apply_series
from .verbs import build_ablation, build_one, make_tree, report_check, resolve_base


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="build.sh", description=PACKAGE_DOC.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Environment: VLLM_DCU_CACHE (download cache, default ~/.cache/vllm-dcu).")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ablation", action="store_true",
                   help="baseline (no patches) plus every cumulative prefix, into dist/ablation/")
    g.add_argument("--check", action="store_true", help="apply the series only and report each patch")
    g.add_argument("--list", action="store_true", help="list the series with descriptions and whether each applies")
    g.add_argument("--edit", action="store_true", help="leave build/tree with one commit per patch for rebase -i")
    g.add_argument("--refresh", action="store_true", help="write build/tree's commits back to patches/")
    g.add_argument("--tree", action="store_true",
                   help="apply the series and install kernels into the tree only (no wheel; for tests/PYTHONPATH)")
    ap.add_argument("--upto", metavar="NNNN", help="apply the series up to and including this patch")
    ap.add_argument("--without", metavar="NNNN[,NNNN]", help="leave these patches out")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--base-wheel", metavar="FILE", help="overlay the series on this wheel (e.g. vllm_cscc's)")
    src.add_argument("--base-installed", action="store_true",
                     help="overlay the series on the vllm installed in this Python (PYTHON=...; the DCU container's)")
    src.add_argument("--source", metavar="DIR", help="apply the series to a source checkout and run its wheel build")
    ap.add_argument("--dist", metavar="DIR", default=None, help="output folder (default dist/)")
    ap.add_argument("--tree-dir", metavar="DIR", default=None, help="work tree (default build/tree)")
    return ap


def run(args: argparse.Namespace, repo: Path = REPO) -> None:
    out_dir = Path(args.dist) if args.dist else repo / "dist"
    tree = Path(args.tree_dir).resolve() if args.tree_dir else repo / "build" / "tree"
    all_patches = load_series(repo)
    check_headers(all_patches)
    if args.ablation and (args.upto or args.without):
        raise BuildError("--ablation builds every prefix itself; it takes no --upto/--without")
    if args.refresh:
        return refresh(repo, tree)
    chosen = select(all_patches, args.upto, args.without)
    if args.source:
        build_source(repo, Path(args.source).resolve(), chosen, out_dir, repo / "build" / "source")
        return
    base = resolve_base(repo, args.base_wheel, args.base_installed)
    if args.check or args.list:
        return report_check(base, chosen, tree, listing=args.list)
    if args.edit:
        apply_series(base.wheel, chosen, tree, repo)
        log(f"edit    {tree}: one commit per patch on top of tag dcu-base. Edit with "
            f"`git -C {tree} rebase -i dcu-base` (keep each commit's Patch-Name trailer), then ./build.sh --refresh")
        return
    if args.tree:
        make_tree(repo, base, chosen, tree)
    elif args.ablation:
        build_ablation(repo, base, chosen, out_dir, tree)
    else:
        build_one(repo, base, chosen, out_dir, tree)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        run(args)
        return 0
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
