"""Pin patterns of a policy (``pin.paths``): what they may say and which relative paths they select.

A pattern is relative to the volume's mount point, ``/``-separated. Without a glob character (``*``, ``?``, ``[``)
it is a path prefix, component-wise: ``db`` selects the file ``db`` and everything under the directory ``db``
(not ``dbx``). With one it is a glob over whole components: ``logs/*.idx`` selects ``logs/a.idx``, not
``logs/old/a.idx`` (``*`` never crosses ``/``; ``**`` is refused rather than guessed at). The literal leading
components are where the walk starts (daemon/pinwalk.py), so a narrow pattern costs a narrow walk.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

GLOB_CHARS = frozenset("*?[")
MAX_COMPONENTS = 64


def pattern_error(p: str) -> str | None:
    """Why a pattern is refused (one phrase), or None."""
    if p.startswith("/"):
        return f"{p!r} is absolute: pin paths are relative to the volume's mount point"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in p):
        return f"{p!r} holds a control character"
    parts = p.rstrip("/").split("/")
    if len(parts) > MAX_COMPONENTS:
        return f"{p[:60]!r}... has more than {MAX_COMPONENTS} components"
    for c in parts:
        if c in ("", ".", ".."):
            return f"{p!r} has an empty, '.' or '..' component"
        if "**" in c:
            return f"{p!r}: '**' is not supported (a '*' matches within one component)"
        if not _brackets_closed(c):
            return f"{p!r}: unbalanced '[' in {c!r}"
    return None


def _brackets_closed(c: str) -> bool:
    i = 0
    while i < len(c):
        if c[i] == "[":
            j = i + 1
            if j < len(c) and c[j] in "!^":
                j += 1
            if j < len(c) and c[j] == "]":
                j += 1
            k = c.find("]", j)
            if k < 0:
                return False
            i = k + 1
        else:
            i += 1
    return True


def is_glob(component: str) -> bool:
    return any(ch in GLOB_CHARS for ch in component)


@dataclass(frozen=True, slots=True)
class Pattern:
    parts: tuple[str, ...]
    glob: bool

    @classmethod
    def parse(cls, p: str) -> Pattern:
        parts = tuple(p.rstrip("/").split("/"))
        return cls(parts, any(is_glob(c) for c in parts))

    def root(self) -> tuple[str, ...]:
        """The literal leading components: the directory (or file) the walk for this pattern starts from."""
        out = []
        for c in self.parts[:-1] if self.glob else self.parts:
            if is_glob(c):
                break
            out.append(c)
        return tuple(out)

    def matches(self, parts: tuple[str, ...]) -> bool:
        if not self.glob:
            return parts[:len(self.parts)] == self.parts
        return len(parts) == len(self.parts) and all(
            fnmatch.fnmatchcase(c, g) for c, g in zip(parts, self.parts, strict=True))


def compile_patterns(paths: tuple[str, ...]) -> tuple[Pattern, ...]:
    return tuple(Pattern.parse(p) for p in paths)


def walk_roots(pats: tuple[Pattern, ...]) -> list[tuple[str, ...]]:
    """The fewest roots that cover every pattern (a root under another root is walked with it)."""
    roots = sorted({p.root() for p in pats}, key=len)
    out: list[tuple[str, ...]] = []
    for r in roots:
        if not any(r[:len(o)] == o for o in out):
            out.append(r)
    return out
