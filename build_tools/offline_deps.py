"""Does an offline artifact folder hold everything pip will need? Upstream's runtime dependencies.

    python -m build_tools.offline_deps DIR [--cuda 13]

An offline install (`pip install --no-index --find-links DIR .`, docs/building.md) fails at pip's
resolution, after the fork's metadata was built, when a runtime dependency of the pinned upstream
packages is neither installed in the environment nor a wheel in DIR. This check reads those
dependencies from the pinned artifacts themselves (the wheels' METADATA, the sdist's PKG-INFO; an
extra's requirements and those whose environment marker does not apply are left out) and names
each one that nothing satisfies, with the `pip download` line that fetches it on a machine with
network. Exit status: 0 when nothing is missing, 1 otherwise, 2 for an unusable folder.
"""

import argparse
import email.parser
import re
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import pinned


def declared_requirements(artifact_path: Path) -> List[Requirement]:
    """Requires-Dist of a wheel's METADATA or an sdist's PKG-INFO."""
    if artifact_path.name.endswith(".whl"):
        with zipfile.ZipFile(artifact_path) as wheel:
            name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            text = wheel.read(name).decode()
    else:
        with tarfile.open(artifact_path) as sdist:
            member = next(m for m in sdist.getmembers() if re.fullmatch(r"[^/]+/PKG-INFO", m.name))
            text = sdist.extractfile(member).read().decode()
    message = email.parser.Parser().parsestr(text)
    return [Requirement(r) for r in message.get_all("Requires-Dist") or []]


def runtime_requirements(
    requirements: Iterable[Requirement], extras: Iterable[str] = ()
) -> List[Requirement]:
    """The requirements an install with `extras` (none by default) must satisfy here (markers
    evaluated: a requirement is kept when its marker holds without an extra or with one of
    `extras`)."""
    extras = ("",) + tuple(extras)
    kept = []
    for req in requirements:
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        kept.append(req)
    return kept


def _folder_wheels(folder: Path, name: str) -> List[tuple]:
    """(version, path) of the wheels of project `name` in `folder`."""
    found = []
    for wheel in folder.glob("*.whl"):
        try:
            project, version, _, _ = parse_wheel_filename(wheel.name)
        except ValueError:
            continue
        if project == canonicalize_name(name):
            found.append((version, wheel))
    return found


def _installed_version(name: str) -> Optional[Version]:
    try:
        return Version(metadata.version(name))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def _spec(req: Requirement) -> str:
    """The requirement without its marker (markers were evaluated here): what pip download takes."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def missing(requirements: Iterable[Requirement], folder: Path, pinned_names=()) -> List[str]:
    """The requirements that neither the environment nor a wheel in `folder` satisfies, and, for
    a requirement that a wheel of the folder satisfies, that wheel's own requirements likewise
    (an installed package brings its own), with the extras the requirement asks for
    (`nvidia-cutlass-dsl[cu13]` needs its cu13 libraries). The pinned upstream packages
    themselves are the folder's by construction."""
    pinned_names = {canonicalize_name(n) for n in pinned_names}
    out, seen = set(), set()
    todo = list(requirements)
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), str(req.specifier), tuple(sorted(req.extras)))
        if key in seen or key[0] in pinned_names:
            continue
        seen.add(key)
        installed = _installed_version(req.name)
        if installed is not None and req.specifier.contains(installed, prereleases=True):
            continue
        wheels = [(v, w) for v, w in _folder_wheels(folder, req.name)
                  if req.specifier.contains(v, prereleases=True)]  # fmt: skip
        if not wheels:
            out.add(_spec(req))
            continue
        todo += runtime_requirements(declared_requirements(max(wheels)[1]), req.extras)
    return sorted(out)


def check_folder(folder: Path, cuda_major: int) -> List[str]:
    """Every runtime requirement of the pinned artifacts for `cuda_major` that nothing here
    satisfies. Raises FileNotFoundError for a pinned artifact the folder lacks."""
    artifacts = pinned.install_artifacts(cuda_major)
    reqs = []
    for artifact in artifacts:
        path = folder / artifact.filename
        if not path.is_file():
            raise FileNotFoundError(f"{artifact.filename} is not in {folder}")
        reqs += runtime_requirements(declared_requirements(path))
    return missing(reqs, folder, pinned_names=[a.project for a in artifacts])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the offline artifact folder")
    parser.add_argument("--cuda", type=int, default=13, choices=pinned.SUPPORTED_CUDA_MAJORS)
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder} is not a folder", file=sys.stderr)
        return 2
    try:
        gaps = check_folder(args.folder, args.cuda)
    except FileNotFoundError as err:
        print(f"error: {err} (python -m build_tools.fetch --cuda {args.cuda} --cache-dir DIR)",
              file=sys.stderr)  # fmt: skip
        return 2
    if not gaps:
        print(f"{args.folder}: every runtime dependency of the pinned packages is satisfied")
        return 0
    print(
        f"{args.folder}: {len(gaps)} runtime dependencies are neither installed nor in the folder:"
    )
    for req in gaps:
        print(f"  {req}")
    quoted = " ".join(f"'{r}'" for r in gaps)
    print(f"fetch them on a machine with network: pip download -d {args.folder} {quoted}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
