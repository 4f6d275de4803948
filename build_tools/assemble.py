"""Assemble the fork's `transformer_engine` package tree.

1. unpack `transformer_engine/` from the pinned pure-Python upstream wheel (sha256-checked);
2. apply `patches/series` in order (strictly, see build_tools.patching);
3. overlay the files this repository adds under its own `transformer_engine/` tree; an overlay file
   never replaces an upstream file: a collision is an error;
4. write `transformer_engine/_fork_build_info.py`, the record of what was patched.

    python -m build_tools.assemble --check          # CI: does the series apply? (exit 1 if not)
    python -m build_tools.assemble --out DIR        # write DIR/transformer_engine
    python -m build_tools.assemble --out DIR --no-overlay   # upstream + patches (to write a patch)
"""

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence

from . import PATCHES_DIR, REPO_ROOT, fetch, pinned
from .patching import PatchError, apply_patch, read_series

PACKAGE = pinned.PACKAGE
BUILD_INFO = "_fork_build_info.py"

# The overlay carries the package's Python side. Native sources are compiled into the
# transformer_engine_exact_fp8 extension instead, and build products never travel.
OVERLAY_SKIP_DIRS = {"__pycache__"}
OVERLAY_SKIP_NAMES = {"CMakeLists.txt"}
OVERLAY_SKIP_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hpp", ".inl"}
OVERLAY_SKIP_SUFFIXES |= {".o", ".so", ".pyc", ".pyo"}


class OverlayError(RuntimeError):
    """A file of the repository's tree would replace a file of the upstream tree."""


def unpack_package(wheel: Path, dest: Path) -> Path:
    """Extract the `transformer_engine/` members of `wheel` into `dest`; return the package dir."""
    package_dir = Path(dest) / PACKAGE
    if package_dir.exists():
        raise FileExistsError(f"{package_dir} already exists; assemble into a fresh folder")
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            parts = PurePosixPath(member).parts
            if parts[:1] != (PACKAGE,) or member.endswith("/"):
                continue
            if ".." in parts:
                raise RuntimeError(f"{wheel.name}: member {member} leaves the tree")
            target = Path(dest, *parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))
    return package_dir


def overlay_files(repo_root: Path = REPO_ROOT) -> List[PurePosixPath]:
    """The files of `repo_root/transformer_engine` that go into the package (relative paths)."""
    source = Path(repo_root) / PACKAGE
    if not source.is_dir():
        return []
    return sorted(
        PurePosixPath(path.relative_to(source).as_posix())
        for path in source.rglob("*")
        if path.is_file() and _overlaid(path.relative_to(source))
    )


def _overlaid(relative: Path) -> bool:
    if any(part.startswith(".") or part in OVERLAY_SKIP_DIRS for part in relative.parts):
        return False
    return relative.name not in OVERLAY_SKIP_NAMES and relative.suffix not in OVERLAY_SKIP_SUFFIXES


def overlay(package_dir: Path, repo_root: Path = REPO_ROOT) -> List[PurePosixPath]:
    """Copy the repository's new files into `package_dir`; error on any upstream collision."""
    files = overlay_files(repo_root)
    collisions = [f for f in files if _collides(Path(package_dir), f)]
    if collisions:
        listed = "\n  ".join(f"{PACKAGE}/{f}" for f in collisions)
        raise OverlayError(
            "these files of the repository would replace upstream files; change upstream files"
            f" with a patch in patches/ instead:\n  {listed}"
        )
    for relative in files:
        target = Path(package_dir, *relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(repo_root, PACKAGE, *relative.parts), target)
    return files


def _collides(package_dir: Path, relative: PurePosixPath) -> bool:
    """True if `relative` exists upstream, or one of its parents is an upstream file."""
    path = package_dir
    for part in relative.parts:
        path = path / part
        if path.is_file():
            return True
    return path.exists()


BUILD_INFO_TEMPLATE = '''\
"""What this build of the mask-exact FP8 attention fork patched (generated at build time).

The core-library wheels (transformer_engine_cu12/13) ship unpatched copies of the upstream
Python files; installing one of them after the fork silently reverts the fork's patches.
check_patched_files() detects that: `python -m transformer_engine._fork_build_info`.
"""

import hashlib
from pathlib import Path

UPSTREAM_VERSION = {version}
UPSTREAM_WHEEL = {wheel}
UPSTREAM_WHEEL_SHA256 = {wheel_sha}
PATCHES = {patches}
# sha256 of every patched file, by path inside the transformer_engine package.
PATCHED_FILES = {patched}


def modified_patched_files():
    """The patched files whose contents are no longer the ones this build installed."""
    root = Path(__file__).resolve().parent
    return [
        name
        for name, digest in PATCHED_FILES.items()
        if not (root / name).is_file()
        or hashlib.sha256((root / name).read_bytes()).hexdigest() != digest
    ]


def check_patched_files():
    """Raise RuntimeError if a patched file was overwritten after the fork was installed."""
    changed = modified_patched_files()
    if changed:
        raise RuntimeError(
            "these patched files of the mask-exact FP8 fork were overwritten (typically by"
            " reinstalling transformer_engine_cu12/13 after the fork): "
            + ", ".join(changed)
            + ". Reinstall the fork."
        )


if __name__ == "__main__":
    check_patched_files()
    print(f"{{len(PATCHED_FILES)}} patched files intact ({{len(PATCHES)}} patches)")
'''


def _tuple_literal(items: Sequence[str]) -> str:
    return "(\n" + "".join(f"    {json.dumps(item)},\n" for item in items) + ")"


def _dict_literal(items: Dict[str, str]) -> str:
    rows = "".join(f"    {json.dumps(k)}: {json.dumps(v)},\n" for k, v in sorted(items.items()))
    return "{\n" + rows + "}"


def write_build_info(package_dir: Path, patches: List[Path], patched: List[str]) -> Path:
    """Write the build record; `patched` paths are relative to the package's parent."""
    target = Path(package_dir) / BUILD_INFO
    if target.exists():
        raise OverlayError(f"{PACKAGE}/{BUILD_INFO} exists upstream or in the repository")
    digests = {}
    for path in sorted(set(patched)):
        inside = PurePosixPath(path).relative_to(PACKAGE)
        digests[str(inside)] = hashlib.sha256(Path(package_dir, inside).read_bytes()).hexdigest()
    wheel = pinned.PURE_PYTHON_WHEEL
    target.write_text(
        BUILD_INFO_TEMPLATE.format(
            version=json.dumps(pinned.UPSTREAM_VERSION),
            wheel=json.dumps(wheel.filename),
            wheel_sha=json.dumps(wheel.sha256),
            patches=_tuple_literal([p.name for p in patches]),
            patched=_dict_literal(digests),
        )
    )
    return target


def assemble(
    dest: Path,
    *,
    offline_dir: Optional[Path] = None,
    cache_dir: Optional[Path] = None,
    patches_dir: Path = PATCHES_DIR,
    repo_root: Optional[Path] = REPO_ROOT,
) -> Path:
    """Build the fork's package tree as `dest/transformer_engine`; return that folder.

    `repo_root=None` skips the overlay and the build record (upstream plus patches only).
    Raises ArtifactError, PatchError or OverlayError.
    """
    wheel = fetch.fetch(pinned.PURE_PYTHON_WHEEL, cache_dir=cache_dir, offline_dir=offline_dir)
    patches = read_series(patches_dir)
    package_dir = unpack_package(wheel, Path(dest))
    patched: List[str] = []
    for patch in patches:
        patched += apply_patch(patch, Path(dest))
    if repo_root is not None:
        write_build_info(package_dir, patches, patched)
        overlay(package_dir, repo_root)
    return package_dir


def check(
    offline_dir: Optional[Path] = None,
    cache_dir: Optional[Path] = None,
    patches_dir: Path = PATCHES_DIR,
    repo_root: Path = REPO_ROOT,
) -> int:
    """Apply the series to a scratch copy of upstream, printing OK/FAIL per patch; 0 if clean."""
    wheel = fetch.fetch(pinned.PURE_PYTHON_WHEEL, cache_dir=cache_dir, offline_dir=offline_dir)
    print(f"upstream {wheel.name} (sha256 OK)")
    patches = read_series(patches_dir)
    with tempfile.TemporaryDirectory(prefix="te-fork-check-") as tmp:
        package_dir = unpack_package(wheel, Path(tmp))
        failed = _check_patches(patches, Path(tmp))
        if not failed:
            failed = not _check_overlay(package_dir, repo_root)
    print("FAILED" if failed else f"the series applies cleanly ({len(patches)} patches)")
    return 1 if failed else 0


def _check_patches(patches: List[Path], tree: Path) -> bool:
    """Apply in order, reporting each; the patches after a failure are not tried."""
    failed = False
    for patch in patches:
        if failed:
            print(f"SKIP {patch.name} (an earlier patch failed)")
            continue
        try:
            changed = apply_patch(patch, tree)
        except PatchError as e:
            print(f"FAIL {patch.name}\n     {e}")
            failed = True
        else:
            print(f"OK   {patch.name} ({', '.join(changed)})")
    return failed


def _check_overlay(package_dir: Path, repo_root: Path) -> bool:
    try:
        files = overlay(package_dir, repo_root)
    except OverlayError as e:
        print(f"FAIL overlay: {e}")
        return False
    print(f"OK   overlay ({len(files)} new files)")
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m build_tools.assemble", description=__doc__.split("\n\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="report whether the series applies")
    action.add_argument("--out", type=Path, help="write the package tree to OUT/transformer_engine")
    parser.add_argument("--no-overlay", action="store_true", help="upstream + patches only")
    parser.add_argument("--offline", type=Path, help="take upstream artifacts from DIR")
    parser.add_argument("--cache-dir", type=Path, help="artifact cache (see build_tools.fetch)")
    parser.add_argument("--patches", type=Path, default=PATCHES_DIR, help="patch folder")
    args = parser.parse_args(argv)
    try:
        if args.check:
            return check(args.offline, args.cache_dir, args.patches)
        repo_root = None if args.no_overlay else REPO_ROOT
        package_dir = assemble(
            args.out,
            offline_dir=args.offline,
            cache_dir=args.cache_dir,
            patches_dir=args.patches,
            repo_root=repo_root,
        )
    except (fetch.ArtifactError, PatchError, OverlayError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"assembled {package_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
