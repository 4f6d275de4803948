"""Fetch the pinned upstream artifacts and verify their sha256.

Wheels are downloaded with `pip download` (so pip's index, proxy and certificate settings apply).
The torch-extension sdist is taken straight from the package index: `pip download` would build its
metadata, which installs PyTorch into a build environment. Offline, the artifacts are taken from a
local folder (`--offline DIR` or NVTE_FORK_ARTIFACTS_DIR). Every file is sha256-checked, always.

    python -m build_tools.fetch                      # the pure-Python wheel into the cache
    python -m build_tools.fetch --cuda 13 --cache-dir DIR   # everything an install needs
    python -m build_tools.fetch --all --offline DIR  # verify a prepared offline folder
    python -m build_tools.fetch --cutlass            # the CUTLASS headers (build time only)

`cutlass_include_dir` unpacks the headers of the pinned `nvidia-cutlass` wheel into the cache and
returns their include folder (the sm90 attention kernel's build needs it).
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from typing import List, Optional, Sequence

from . import pinned

OFFLINE_ENV = "NVTE_FORK_ARTIFACTS_DIR"
CACHE_ENV = "NVTE_FORK_CACHE_DIR"
DEFAULT_INDEX_URL = "https://pypi.org/simple"


class ArtifactError(RuntimeError):
    """A pinned artifact is missing, cannot be downloaded, or has the wrong sha256."""


def default_cache_dir() -> Path:
    """$NVTE_FORK_CACHE_DIR, else $XDG_CACHE_HOME/te-mask-exact/artifacts (~/.cache/...)."""
    if os.getenv(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.getenv("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "te-mask-exact" / "artifacts"


def offline_dir_from_env() -> Optional[Path]:
    """The offline artifact folder named by NVTE_FORK_ARTIFACTS_DIR, if any."""
    value = os.getenv(OFFLINE_ENV)
    return Path(value) if value else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, artifact: pinned.Artifact) -> Path:
    """Return `path` if its sha256 is the pinned one, else raise ArtifactError."""
    actual = sha256_of(path)
    if actual != artifact.sha256:
        raise ArtifactError(
            f"sha256 mismatch for {artifact.filename} at {path}:\n"
            f"  expected {artifact.sha256}\n  actual   {actual}\n"
            "The file is not the pinned upstream artifact; delete it and fetch again."
        )
    return path


def fetch(
    artifact: pinned.Artifact,
    cache_dir: Optional[Path] = None,
    offline_dir: Optional[Path] = None,
) -> Path:
    """Path to a verified copy of `artifact`.

    With `offline_dir` (default: NVTE_FORK_ARTIFACTS_DIR) the file is taken from that folder and
    nothing is downloaded. Otherwise it is taken from `cache_dir` (default: default_cache_dir()),
    downloading it there first if needed.
    """
    offline_dir = offline_dir or offline_dir_from_env()
    if offline_dir is not None:
        return _take_offline(artifact, Path(offline_dir))
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    cached = cache_dir / artifact.filename
    if not cached.is_file():
        _download_into(artifact, cache_dir)
    return verify(cached, artifact)


def _take_offline(artifact: pinned.Artifact, folder: Path) -> Path:
    path = folder / artifact.filename
    if not path.is_file():
        raise ArtifactError(
            f"offline mode: {artifact.filename} is not in {folder} (sha256 {artifact.sha256});"
            f" put it there, or fetch online (without --offline and {OFFLINE_ENV})"
        )
    return verify(path, artifact)


def _download_into(artifact: pinned.Artifact, cache_dir: Path) -> None:
    """Download into a private temp folder, verify, then move into the cache."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        if artifact.is_sdist:
            downloaded = _index_download(artifact, Path(tmp))
        else:
            downloaded = _pip_download(artifact, Path(tmp))
        verify(downloaded, artifact)
        os.replace(downloaded, cache_dir / artifact.filename)


def _pip_download(artifact: pinned.Artifact, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--dest", str(dest)]
    if artifact.platform_tag != "any":
        cmd += ["--platform", artifact.platform_tag]
    cmd.append(artifact.requirement)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(
            f"pip download of {artifact.filename} failed ({' '.join(cmd)}):\n{result.stderr}"
        )
    return _expect_file(dest, artifact)


def _expect_file(folder: Path, artifact: pinned.Artifact) -> Path:
    path = folder / artifact.filename
    if not path.is_file():
        got = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        raise ArtifactError(f"expected to download {artifact.filename}, got {got}")
    return path


class _LinkCollector(HTMLParser):
    """Collect the href of every anchor of a PEP 503 simple-index page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: List[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.extend(value for name, value in attrs if name == "href" and value)


def _index_download(artifact: pinned.Artifact, dest: Path) -> Path:
    url = _find_on_index(artifact)
    path = dest / artifact.filename
    try:
        with urllib.request.urlopen(url) as response, open(path, "wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as e:
        raise ArtifactError(f"download of {artifact.filename} from {url} failed: {e}") from e
    return path


def _find_on_index(artifact: pinned.Artifact) -> str:
    """URL of `artifact` on the simple index ($PIP_INDEX_URL, else PyPI)."""
    index = os.getenv("PIP_INDEX_URL", DEFAULT_INDEX_URL).rstrip("/")
    page = f"{index}/{artifact.project.replace('_', '-').lower()}/"
    try:
        with urllib.request.urlopen(page) as response:
            html = response.read().decode("utf-8", "replace")
    except OSError as e:
        raise ArtifactError(f"cannot read the package index page {page}: {e}") from e
    collector = _LinkCollector()
    collector.feed(html)
    for href in collector.hrefs:
        url = urllib.parse.urljoin(page, href.split("#", 1)[0])
        if urllib.parse.unquote(url.rsplit("/", 1)[-1]) == artifact.filename:
            return url
    raise ArtifactError(f"{artifact.filename} is not listed on {page}")


def cutlass_include_dir(
    cache_dir: Optional[Path] = None, offline_dir: Optional[Path] = None
) -> Path:
    """The `include` folder of the pinned CUTLASS headers (cute/, cutlass/), unpacked once.

    The wheel is fetched (and sha256-checked) as `fetch` does, from `offline_dir` (default:
    NVTE_FORK_ARTIFACTS_DIR) or the cache; its headers are unpacked into the cache under a
    folder named by the wheel's sha256, so a different wheel can never reuse them.
    """
    artifact = pinned.CUTLASS_WHEEL
    wheel = fetch(artifact, cache_dir=cache_dir, offline_dir=offline_dir)
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache_dir / f"cutlass-{artifact.version}-{artifact.sha256[:16]}" / "include"
    if (target / "cute" / "tensor.hpp").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".unpack-") as tmp:
        unpacked = Path(tmp) / "include"
        prefix = pinned.CUTLASS_INCLUDE_PREFIX
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")]
            if not members:
                raise ArtifactError(f"{artifact.filename} holds no headers under {prefix}")
            for name in members:
                relative = name[len(prefix) :]
                if relative.startswith("/") or ".." in Path(relative).parts:
                    raise ArtifactError(f"{artifact.filename}: unsafe member name {name!r}")
                out = unpacked / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(name) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        if not (unpacked / "cute" / "tensor.hpp").is_file():
            raise ArtifactError(f"{artifact.filename} has no cute/tensor.hpp under {prefix}")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(unpacked, target)
    return target


def _selected(args: argparse.Namespace) -> Sequence[pinned.Artifact]:
    if args.all:
        return pinned.ALL_ARTIFACTS + pinned.BUILD_ARTIFACTS
    if args.cutlass:
        return pinned.BUILD_ARTIFACTS
    if args.cuda is not None:
        return pinned.install_artifacts(args.cuda)
    return (pinned.PURE_PYTHON_WHEEL,)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m build_tools.fetch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--offline", type=Path, help="take artifacts from DIR, download nothing")
    parser.add_argument(
        "--cache-dir", type=Path, help=f"download into DIR (default: {default_cache_dir()})"
    )
    parser.add_argument(
        "--cuda", type=int, choices=pinned.SUPPORTED_CUDA_MAJORS, help="all an install needs"
    )
    parser.add_argument("--all", action="store_true", help="every pinned artifact")
    parser.add_argument(
        "--cutlass", action="store_true", help="the CUTLASS headers wheel (build time only)"
    )
    args = parser.parse_args(argv)
    failed = 0
    for artifact in _selected(args):
        try:
            path = fetch(artifact, cache_dir=args.cache_dir, offline_dir=args.offline)
        except ArtifactError as e:
            print(f"FAIL {artifact.filename}: {e}", file=sys.stderr)
            failed += 1
        else:
            print(f"OK   {path} (sha256 {artifact.sha256})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
