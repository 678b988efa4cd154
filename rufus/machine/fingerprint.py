"""Content digests of built files, hashed again only when a file's metadata changed.

Setup checks on every ``make serve`` that the models it built are intact. Hashing them each
time (hundreds of MB) made a cached restart wait seconds; instead each digest is kept in
``$RUFUS_CACHE_DIR/fingerprints.json`` beside the file's stat fingerprint (size, mtime,
ctime, inode, device), and a file is read again only when that fingerprint changed.

How a corrupted file is still caught: any write through the filesystem changes the file's
ctime, which no tool can set back (``touch -d`` restores mtime only), so an edited,
truncated or replaced file is hashed again and its new digest fails the stamp. What a
fingerprint cannot see is corruption below the filesystem (a bad disk block): ``scripts/
setup.sh verify`` forgets every fingerprint and hashes everything, as the image build does
from a clean cache. The store is best effort: unwritable (a read-only image layer), every
check hashes, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from rufus.machine.caches import cache_dir

STORE_NAME = "fingerprints.json"
FORMAT = 1


def store_path() -> Path:
    """Where the fingerprints are kept (beside the models they describe)."""
    return cache_dir() / STORE_NAME


def stat_key(path: Path) -> list[int]:
    """What changes whenever the file's bytes could have changed."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def feed(h: Any, path: Path) -> None:
    """Add a file's bytes to the hash ``h``, read in 1 MiB chunks."""
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file."""
    h = hashlib.sha256()
    feed(h, path)
    return h.hexdigest()


class Fingerprints:
    """A digest per (kind, files), valid while every file's :func:`stat_key` is unchanged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
            self.entries: dict[str, dict] = data["entries"] if data.get("format") == FORMAT else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.entries = {}

    def digest(self, kind: str, paths: Sequence[Path], compute: Callable[[], str]) -> str:
        """``compute()``'s digest of ``paths``, from the store while their stats match."""
        key = kind + ":" + "|".join(str(p.resolve()) for p in paths)
        stats = [stat_key(p) for p in paths]
        entry = self.entries.get(key)
        if isinstance(entry, dict) and entry.get("stat") == stats:
            return str(entry["digest"])
        value = compute()
        # Stat again after reading: a file written while it was hashed is hashed next time.
        if [stat_key(p) for p in paths] == stats:
            self.entries[key] = {"stat": stats, "digest": value}
            self.save()
        return value

    def save(self) -> None:
        """Write the store atomically; a store that cannot be written is skipped."""
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"format": FORMAT, "entries": self.entries}))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)


@lru_cache(maxsize=4)
def _load(path: Path) -> Fingerprints:
    return Fingerprints(path)


def store() -> Fingerprints:
    """The process's store, loaded on first use (not at import)."""
    return _load(store_path())


def sha256(path: Path) -> str:
    """SHA-256 of ``path``, hashed only if its stat fingerprint changed since last time."""
    return store().digest("sha256", [path], lambda: file_sha256(path))


def forget() -> None:
    """Drop every fingerprint: the next checks hash every file (``setup.sh verify``)."""
    store_path().unlink(missing_ok=True)
    _load.cache_clear()
