"""Stat fingerprints: a cached check reads nothing, and any write is still caught."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rufus.machine import fingerprint


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RUFUS_CACHE_DIR", str(tmp_path / "cache"))
    fingerprint.forget()
    yield tmp_path
    fingerprint.forget()


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    real = fingerprint.file_sha256

    def counting(path: Path) -> str:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(fingerprint, "file_sha256", counting)
    return reads


def test_unchanged_file_is_not_read_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = cache / "weights.bin"
    f.write_bytes(b"x" * 4096)
    reads = _count_reads(monkeypatch)
    first = fingerprint.sha256(f)
    fingerprint._load.cache_clear()  # a new process: the store is read from disk
    assert fingerprint.sha256(f) == first == fingerprint.file_sha256(f)
    assert reads.count(f) == 2  # the first check, and the direct call above; not the second
    assert fingerprint.store_path().is_file()


def test_an_edit_is_caught_even_with_the_mtime_set_back(cache: Path) -> None:
    f = cache / "weights.bin"
    f.write_bytes(b"a" * 4096)
    before = fingerprint.sha256(f)
    st = f.stat()
    with f.open("r+b") as fh:  # same size, one byte flipped
        fh.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime restored; ctime cannot be
    fingerprint._load.cache_clear()
    assert fingerprint.sha256(f) != before
    assert fingerprint.sha256(f) == fingerprint.file_sha256(f)


def test_a_replaced_file_is_hashed_again(cache: Path) -> None:
    f = cache / "config.json"
    f.write_text("{}")
    before = fingerprint.sha256(f)
    tmp = cache / "new.json"
    tmp.write_text("[]")
    tmp.replace(f)
    assert fingerprint.sha256(f) != before


def test_forget_hashes_everything_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = cache / "weights.bin"
    f.write_bytes(b"z" * 100)
    fingerprint.sha256(f)
    fingerprint.forget()
    assert not fingerprint.store_path().exists()
    reads = _count_reads(monkeypatch)
    fingerprint.sha256(f)
    assert reads == [f]


def test_digest_of_several_files_tracks_each(cache: Path) -> None:
    a, b = cache / "a", cache / "b"
    a.write_text("1")
    b.write_text("2")
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return a.read_text() + b.read_text()

    store = fingerprint.store()
    assert store.digest("pair", [a, b], compute) == "12"
    assert store.digest("pair", [a, b], compute) == "12"
    assert len(calls) == 1
    b.write_text("3")
    assert store.digest("pair", [a, b], compute) == "13"
    assert len(calls) == 2


def test_unwritable_or_corrupt_store_still_checks(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = cache / "weights.bin"
    f.write_bytes(b"q" * 10)
    fingerprint.store_path().parent.mkdir(parents=True, exist_ok=True)
    fingerprint.store_path().write_text("not json")
    fingerprint._load.cache_clear()
    assert fingerprint.sha256(f) == fingerprint.file_sha256(f)

    def refuse(*_a: object, **_k: object) -> None:
        raise PermissionError("read-only layer")

    monkeypatch.setattr(Path, "write_text", refuse)
    fingerprint._load.cache_clear()
    g = cache / "other.bin"
    g.write_bytes(b"r")
    assert fingerprint.sha256(g) == fingerprint.file_sha256(g)
