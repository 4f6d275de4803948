"""Strict unified-diff application, in pure Python (no `patch` or `git` needed).

Strict means: no fuzz, no offsets, no whitespace leniency. Every hunk must match the target's
lines exactly, byte for byte, at the position its @@ header states. A patch that does not apply
raises PatchError naming the patch file, the target file, the hunk's @@ header and the first line
that does not match. A patch's files are all checked before any of them is written.

Patches modify existing upstream files only (paths `a/transformer_engine/...` and
`b/transformer_engine/...`); files the fork adds live in the repository instead. Text before the
first `--- ` header (a description) is ignored.
"""

import difflib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, NoReturn, Optional

SERIES_FILE = "series"
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(RuntimeError):
    """A patch is malformed or does not apply exactly."""


@dataclass
class Hunk:
    header: str  # the @@ line, without its line ending
    old_start: int
    new_start: int
    old: List[str]  # the lines the hunk expects: context and removed lines, with line endings
    new: List[str]  # the lines it leaves: context and added lines


@dataclass
class FilePatch:
    path: str  # relative to the tree root, e.g. "transformer_engine/common/recipe/__init__.py"
    hunks: List[Hunk]


def split_lines(text: str) -> List[str]:
    """Split on "\\n" only, keeping line endings (str.splitlines also splits on \\f, \\x1c...)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _strip_newline(line: str) -> str:
    return line[:-1] if line.endswith("\n") else line


class _Reader:
    """Cursor over the lines of one patch file; errors name the patch and line number."""

    def __init__(self, text: str, name: str) -> None:
        self.lines = split_lines(text)
        self.pos = 0
        self.name = name

    def peek(self) -> Optional[str]:
        return self.lines[self.pos] if self.pos < len(self.lines) else None

    def take(self) -> Optional[str]:
        line = self.peek()
        self.pos += 1
        return line

    def fail(self, message: str) -> NoReturn:
        raise PatchError(f"{self.name}: line {self.pos}: {message}")


def parse_patch(text: str, name: str) -> List[FilePatch]:
    """Parse a unified diff into per-file hunks."""
    reader = _Reader(text, name)
    files: List[FilePatch] = []
    while _skip_to_file_header(reader, strict=bool(files)):
        path = _read_paths(reader)
        hunks = []
        while (reader.peek() or "").startswith("@@"):
            hunks.append(_read_hunk(reader))
        if not hunks:
            reader.fail(f"no hunks for {path}")
        files.append(FilePatch(path, hunks))
    if not files:
        raise PatchError(f"{name}: no file diff found (expected '--- a/...' and '+++ b/...')")
    return files


def _is_stray_hunk_line(line: str) -> bool:
    """A line that looks like hunk content outside any hunk (a wrong @@ line count)."""
    if line.startswith(("--- ", "-- \n", "--\n")):
        return False
    return line.startswith(("+", " ", "-", "@@", "\\"))


def _skip_to_file_header(reader: _Reader, strict: bool) -> bool:
    """Advance to the next `--- `/`+++ ` pair; False at the end of the patch."""
    while reader.peek() is not None:
        line = reader.peek()
        nxt = reader.lines[reader.pos + 1] if reader.pos + 1 < len(reader.lines) else ""
        if line.startswith("--- ") and nxt.startswith("+++ "):
            return True
        if strict and _is_stray_hunk_line(line):
            reader.pos += 1
            reader.fail(f"unexpected hunk line after the last hunk {line!r}: wrong @@ counts?")
        reader.pos += 1
    return False


def _header_path(line: str) -> str:
    """The path of a `--- ` or `+++ ` line, without diff's tab-separated timestamp."""
    return _strip_newline(line[4:]).split("\t", 1)[0].strip()


def _read_paths(reader: _Reader) -> str:
    old, new = _header_path(reader.take()), _header_path(reader.take())
    if "/dev/null" in (old, new):
        reader.fail(
            f"'{old}' -> '{new}' creates or deletes a file; patches only modify upstream files"
            " (new files belong in the repository's transformer_engine/ tree)"
        )
    if not (old.startswith("a/") and new.startswith("b/")) or old[2:] != new[2:]:
        reader.fail(f"expected '--- a/PATH' and '+++ b/PATH' with one PATH, got '{old}', '{new}'")
    path = PurePosixPath(old[2:])
    if path.is_absolute() or ".." in path.parts:
        reader.fail(f"path {path} leaves the tree")
    return str(path)


def _read_hunk(reader: _Reader) -> Hunk:
    header = _strip_newline(reader.take())
    match = HUNK_HEADER.match(header)
    if not match:
        reader.fail(f"malformed hunk header {header!r}")
    old_len = 1 if match[2] is None else int(match[2])
    new_len = 1 if match[4] is None else int(match[4])
    hunk = Hunk(header, int(match[1]), int(match[3]), [], [])
    _read_hunk_body(reader, hunk, old_len, new_len)
    return hunk


def _read_hunk_body(reader: _Reader, hunk: Hunk, old_len: int, new_len: int) -> None:
    last = ""
    while len(hunk.old) < old_len or len(hunk.new) < new_len or _at_no_newline(reader):
        line = reader.take()
        if line is None or line[:1] not in (" ", "-", "+", "\\"):
            _fail_short_hunk(reader, hunk, line)
        tag, body = line[:1], line[1:]
        if tag == "\\":
            _drop_final_newline(hunk, last)
            continue
        if tag in " -":
            hunk.old.append(body)
        if tag in " +":
            hunk.new.append(body)
        if len(hunk.old) > old_len or len(hunk.new) > new_len:
            reader.fail(f"hunk {hunk.header} is longer than its header says")
        last = tag


def _at_no_newline(reader: _Reader) -> bool:
    return (reader.peek() or "").startswith("\\")


def _drop_final_newline(hunk: Hunk, last_tag: str) -> None:
    """Apply a '\\ No newline at end of file' marker to the line before it."""
    if last_tag in " -":
        hunk.old[-1] = _strip_newline(hunk.old[-1])
    if last_tag in " +":
        hunk.new[-1] = _strip_newline(hunk.new[-1])


def _fail_short_hunk(reader: _Reader, hunk: Hunk, line: Optional[str]) -> NoReturn:
    if line == "\n":
        reader.fail(
            f"empty line inside hunk {hunk.header}: context lines start with a space"
            " (did an editor strip trailing whitespace from the patch?)"
        )
    found = "the end of the patch" if line is None else repr(line)
    reader.fail(f"hunk {hunk.header} ends early: found {found} before all its lines")


def apply_hunks(lines: List[str], hunks: List[Hunk], where: str) -> List[str]:
    """Apply `hunks` (in order, at their exact positions) to `lines`; return the new lines."""
    result = list(lines)
    offset = 0  # new lines minus old lines of the hunks applied so far
    consumed = 0  # end of the previous hunk, in original-file lines
    for number, hunk in enumerate(hunks, 1):
        label = f"{where}: hunk #{number} {hunk.header}"
        start = hunk.old_start - 1 if hunk.old else hunk.old_start
        if start < consumed:
            raise PatchError(f"{label} overlaps or precedes the hunk before it")
        at = start + offset
        _check_hunk(result, at, hunk, label)
        result[at : at + len(hunk.old)] = hunk.new
        offset += len(hunk.new) - len(hunk.old)
        consumed = start + len(hunk.old)
    return result


def _check_hunk(lines: List[str], at: int, hunk: Hunk, label: str) -> None:
    expected_new_start = at + 1 if hunk.new else at
    if hunk.new_start != expected_new_start:
        raise PatchError(f"{label}: new start should be {expected_new_start} (inconsistent header)")
    for k, want in enumerate(hunk.old):
        have = lines[at + k] if at + k < len(lines) else None
        if have != want:
            found = "the end of the file" if have is None else repr(have)
            raise PatchError(
                f"{label} does not apply: line {at + k + 1} should be {want!r} but is {found}"
                + _elsewhere_hint(lines, hunk.old)
            )


def _elsewhere_hint(lines: List[str], block: List[str]) -> str:
    for i in range(len(lines) - len(block) + 1):
        if block and lines[i : i + len(block)] == block:
            return f" (the hunk's lines match at line {i + 1}: regenerate the patch)"
    return ""


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "surrogateescape")


def apply_patch(patch_file: Path, tree: Path) -> List[str]:
    """Apply one patch file to `tree`; return the paths it changed (relative to `tree`).

    Nothing is written unless every hunk of every file in the patch applies.
    """
    patch_file, tree = Path(patch_file), Path(tree)
    name = patch_file.name
    staged: Dict[str, List[str]] = {}
    for file_patch in parse_patch(_read_text(patch_file), name):
        path = file_patch.path
        if path not in staged:
            if not (tree / path).is_file():
                raise PatchError(f"{name}: {path}: no such file in the upstream tree")
            staged[path] = split_lines(_read_text(tree / path))
        staged[path] = apply_hunks(staged[path], file_patch.hunks, f"{name}: {path}")
    for path, lines in staged.items():
        (tree / path).write_bytes("".join(lines).encode("utf-8", "surrogateescape"))
    return list(staged)


def read_series(patches_dir: Path) -> List[Path]:
    """The patch files of `patches_dir/series`, in order.

    The series lists one file name per line (`#` starts a comment line). Every `*.patch` file of
    the folder must be listed exactly once, so that no patch is silently left out.
    """
    patches_dir = Path(patches_dir)
    series = patches_dir / SERIES_FILE
    if not series.is_file():
        raise PatchError(f"{series} not found")
    names = [line.strip() for line in _read_text(series).split("\n")]
    names = [n for n in names if n and not n.startswith("#")]
    problems = [f"{n} is listed twice" for n in sorted(set(names)) if names.count(n) > 1]
    problems += [f"{n} is listed but missing" for n in names if not (patches_dir / n).is_file()]
    unlisted = sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in names)
    problems += [f"{n} is not listed" for n in unlisted]
    if problems:
        raise PatchError(f"{series}: " + "; ".join(problems))
    return [patches_dir / n for n in names]


def make_patch(old: str, new: str, path: str) -> str:
    """A unified diff (3 lines of context) turning `old` into `new` for `a/path` / `b/path`."""
    diff = difflib.unified_diff(
        split_lines(old), split_lines(new), fromfile=f"a/{path}", tofile=f"b/{path}"
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
    )
