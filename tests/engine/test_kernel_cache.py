"""The runner's Triton cache: its own source's directory to write, its ancestors' to read, nothing else."""

import json
import os

from tik_evo.kernel_cache import READ_ENV, LineageCache


def test_reads_ancestors_and_writes_only_its_own(tmp_path, monkeypatch):
    own, parent, stranger = tmp_path / "own", tmp_path / "parent", tmp_path / "stranger"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(own))
    monkeypatch.setenv(READ_ENV, str(parent))
    (parent / "K").mkdir(parents=True)
    (parent / "K" / "k.cubin").write_bytes(b"parent")
    (stranger / "K").mkdir(parents=True)
    (stranger / "K" / "other.cubin").write_bytes(b"stranger")
    cache = LineageCache("K")
    assert cache.get_file("k.cubin") == str(parent / "K" / "k.cubin")
    assert cache.get_file("other.cubin") is None  # not an ancestor's
    written = cache.put(b"mine", "k.cubin")
    assert written.startswith(str(own)) and cache.get_file("k.cubin") == written  # its own first
    assert (parent / "K" / "k.cubin").read_bytes() == b"parent"


def test_an_ancestors_group_naming_files_elsewhere_is_ignored(tmp_path, monkeypatch):
    parent = tmp_path / "parent"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "own"))
    monkeypatch.setenv(READ_ENV, str(parent))
    d = parent / "K"
    d.mkdir(parents=True)
    (d / "k.cubin").write_bytes(b"x")
    (tmp_path / "elsewhere.cubin").write_bytes(b"planted")
    (d / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(d / "k.cubin")}}))
    assert LineageCache("K").get_group("k.json") == {"k.cubin": str(d / "k.cubin")}
    (d / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(tmp_path / "elsewhere.cubin")}}))
    assert LineageCache("K").get_group("k.json") is None
    assert os.environ[READ_ENV] == str(parent)
