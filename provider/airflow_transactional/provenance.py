"""What produced a processing attempt: the digests of its code, recorded with the attempt and with
the commit that applies it (``airflow-txn commits``, the run page).

* ``application``: the SHA-256 of the Spark application's file (the script ``spark-submit`` ran, or
  the module defining the transform);
* ``provider``: of this package's sources (its ``.py`` and ``.sql`` files, by name and content --
  what a cluster's executors import from the ``--py-files`` zip);
* ``declaration``: of the topology's declaration as stored (its canonical JSON);
* ``dag_version``: the Airflow DAG version of the run's try (its id, and the bundle's version when
  the bundle is versioned), when Airflow ran it.

Two attempts with equal digests ran the same code on the same declaration: the determinism of a
txid is checked against them.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

#: The keys of a recorded code digest, in the order they are shown.
FIELDS = ("application", "provider", "declaration", "dag_version")


def sha256_text(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def declaration_digest(config: Mapping[str, Any]) -> str:
    """The digest of a declaration's stored form (key order does not matter)."""
    return sha256_text(json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode())


def _sources(node: Traversable, prefix: str) -> list[tuple[str, Traversable]]:
    found = []
    for child in node.iterdir():
        name = f"{prefix}/{child.name}"
        if child.is_dir():
            found += _sources(child, name)
        elif child.name.endswith((".py", ".sql")):
            found.append((name, child))
    return found


@functools.cache
def provider_digest() -> str:
    """The digest of this package's sources as imported (a directory or the ``--py-files`` zip)."""
    digest = hashlib.sha256()
    for name, entry in sorted(_sources(resources.files(__package__), __package__), key=lambda p: p[0]):
        digest.update(name.encode() + b"\0" + hashlib.sha256(entry.read_bytes()).digest())
    return digest.hexdigest()


def file_digest(path: str | Path | None) -> str | None:
    """The digest of an application file (None when there is none to read)."""
    if not path:
        return None
    try:
        return sha256_text(Path(path).read_bytes())
    except OSError:
        return None


def application_digest(transform: Callable[..., object]) -> str | None:
    """The digest of the file that defines ``transform`` (the Spark application), else of the main script."""
    module = sys.modules.get(getattr(transform, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path or (getattr(module, "__name__", "").split(".")[0] == __package__):
        path = getattr(sys.modules.get("__main__"), "__file__", None)  # a helper of ours wraps it
    return file_digest(path)


def function_digest(fn: Callable[..., object]) -> str | None:
    """The digest of a Python function's source (the pure-Python processor's transform), else of its bytecode."""
    try:
        return sha256_text(inspect.getsource(fn).encode())
    except (OSError, TypeError):
        code_object = getattr(fn, "__code__", None)
        return sha256_text(code_object.co_code) if code_object is not None else None


def code(config: Mapping[str, Any], *, application: str | None = None, dag_version: str | None = None
         ) -> dict[str, str]:
    """The code record of an attempt of the topology declared as ``config``."""
    found = {"application": application, "provider": provider_digest(), "declaration": declaration_digest(config),
             "dag_version": dag_version}
    return {k: v for k, v in found.items() if v}


def short(record: Mapping[str, Any] | None) -> str:
    """A code record in one line: each digest's first 12 characters."""
    if not record:
        return "-"
    return " ".join(f"{k[:4]} {str(record[k])[:12]}" for k in FIELDS if record.get(k))
