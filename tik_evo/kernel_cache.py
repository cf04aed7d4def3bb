"""Triton's compile cache inside a runner, scoped by lineage.

A cache entry is whatever file a runner wrote under a key: a candidate could write a slow or wrong binary under
the key of another implementation's kernel. So a runner writes only its own source's directory
(RUN/triton/<source hash>, the one writable place besides its private directory) and reads, beside it, the
directories of its ancestors (parent, grandparent ... root), mounted read-only. Kernels a knob change leaves
alone are then not compiled again, while nothing a candidate writes can be loaded by the best, the root, or any
implementation that does not descend from it.

Selected in the runner by TRITON_CACHE_MANAGER=tik_evo.kernel_cache:LineageCache; TIK_EVO_CACHE_READ lists the
ancestors' directories (os.pathsep-separated).
"""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager

READ_ENV = "TIK_EVO_CACHE_READ"


class LineageCache(FileCacheManager):
    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override, dump)
        self.read_dirs = [os.path.join(d, key) for d in os.environ.get(READ_ENV, "").split(os.pathsep) if d]

    def get_file(self, filename):
        found = super().get_file(filename)
        if found is not None:
            return found
        for d in self.read_dirs:
            path = os.path.join(d, filename)
            if os.path.exists(path):
                return path
        return None

    def get_group(self, filename):
        found = super().get_group(filename)
        if found is not None:
            return found
        for d in self.read_dirs:  # a group names its files by absolute path: only ones inside that directory
            try:
                with open(os.path.join(d, f"__grp__{filename}")) as fh:
                    paths = json.load(fh).get("child_paths") or {}
            except (OSError, ValueError):
                continue
            inside = {c: p for c, p in paths.items() if os.path.dirname(os.path.abspath(p)) == d}
            if inside and len(inside) == len(paths) and all(os.path.exists(p) for p in inside.values()):
                return inside
        return None
