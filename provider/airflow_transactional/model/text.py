"""How the vocabulary reads as text: a batch's span, an error in one line, a wait in words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def same_offsets(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Offsets are equal when every position is; a missing position counts as 0."""
    return all(int(a.get(k, 0)) == int(b.get(k, 0)) for k in set(a) | set(b))


def offsets_moved(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(where, from, to) of each offset a batch moved, partitions in number order (a landing
    directory's single ``seq`` after them): what a person reads as a batch's span."""
    def order(key: str) -> tuple[int, str]:
        return (int(key), "") if str(key).isdigit() else (1 << 62, str(key))

    return [(k, start.get(k, "-"), end.get(k, "-")) for k in sorted(set(start) | set(end), key=order)
            if start.get(k) != end.get(k)]


def span_text(start: Mapping[str, Any], end: Mapping[str, Any]) -> str:
    """A batch's offsets as text: ``partition 0: 10 -> 25, partition 3: 4 -> 9`` (``seq: 3 -> 5``)."""
    return ", ".join(f"{'partition ' if str(k).isdigit() else ''}{k}: {a} -> {b}"
                     for k, a, b in offsets_moved(start, end)) or "nothing new"


def one_line(error: str, limit: int = 300) -> str:
    """The first line of an error that says something (a traceback's header and Spark's empty
    lines skipped), at most ``limit`` characters."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    line = next((x for x in lines if not x.startswith(("Traceback", "File "))), lines[0] if lines else "")
    return line if len(line) <= limit else f"{line[:limit - 3]}..."


def failure_text(exc: BaseException) -> str:
    """What a failed attempt records of its exception: its type and text -- and for an error of
    Spark's JVM (a Py4J error, whose text is the top of a Java stack), the root of its chain of
    causes first (``java.net.ConnectException: Connection refused``), which says what failed."""
    text = f"{type(exc).__name__}: {exc}"
    cause = getattr(exc, "java_exception", None)
    if cause is None:
        return text
    try:
        for _ in range(32):  # a chain of causes, not a cycle
            deeper = cause.getCause()
            if deeper is None:
                break
            cause = deeper
        root = str(cause.toString())
    except Exception:  # the JVM is gone: what the exception says is all there is
        return text
    return f"{type(exc).__name__}, caused by {one_line(root, 500)}\n{text}"


def duration(seconds: float) -> str:
    """A wait in words: "40 s", "12 min", "3.5 h"."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 \
        else f"{seconds / 3600:.1f} h"
