"""Offline Hopper (sm_90a) compilation for the compile reports: no GPU needed, Triton's bundled ptxas/cuobjdump.

Arguments named in `aligned` get the 16-byte divisibility the Triton runtime specialises on at launch; without
it pointer loads are not vectorised or pipelined and a report would describe a kernel that never runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def load_variant(source: Path, knobs: dict, name: str):
    """The module `source` with its KNOBS updated by `knobs`, imported from a temporary copy."""
    from tik_evo.knobs import read_knobs, write_knobs

    text = source.read_text()
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(write_knobs(text, {**read_knobs(text), **knobs}))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_sm90(fn, sig: dict, consts: dict, warps: int, stages: int, aligned: set[str],
                 maxnreg: int | None = None) -> dict:
    """Compile `fn` (a Triton or Gluon kernel; signature `sig`; `consts` become constexpr) and report what ptxas
    and the SASS show."""
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    full = {**sig, **{k: "constexpr" for k in consts if k not in sig}}
    names = list(full)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names}
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    k = triton.compile(source(fn=fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        Path(ptx).write_text(k.asm["ptx"])
        info = subprocess.run([str(BIN / "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", cubin],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    if os.environ.get("SM90_SASS_DIR"):  # keep the SASS for reading (e.g. where a spill lands)
        Path(os.environ["SM90_SASS_DIR"], f"{fn.__name__}.sass").write_text(sass)
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, info)) else None  # noqa: E731
    code = "\n".join(re.findall(r"/\*[0-9a-f]{4,}\*/[^\n]*", sass))  # addresses grow past 4 hex digits
    return {"shared_bytes": k.metadata.shared, "registers": num(r"Used (\d+) registers"),
            "spill_store_bytes": num(r"(\d+) bytes spill stores"), "HGMMA": sass.count("HGMMA"),
            "HMMA": sass.count("HMMA"), "UTMALDG": sass.count("UTMALDG"), "LDG": len(re.findall(r"\bLDG", sass)),
            "instructions": code.count("\n") + 1 if code else 0, "SHFL": len(re.findall(r"\bSHFL", code)),
            "BAR": len(re.findall(r"\bBAR\.", code)), "STS": len(re.findall(r"\bSTS", code)),
            "USETMAXREG": code.count("USETMAXREG"), "ATOM": len(re.findall(r"\bATOMG?\.", code)),
            "sass_sha": hashlib.sha256(code.encode()).hexdigest()[:12], "fp_ops": _fp_ops(code),
            "ptxas_warnings": re.findall(r"\(C\d+\)[^\n]*", info)}


def _fp_ops(code: str) -> dict[str, int]:
    """How many of each floating-point and MMA instruction the SASS has (opcode with its modifiers). A kernel meant
    to do another's arithmetic must show the same counts, whatever its address code and schedule (necessary, not
    sufficient: the GPU's bitwise checks decide)."""
    ops = re.findall(r"\b((?:FFMA|FMUL|FADD|FMNMX|FSEL|FSETP|MUFU|HGMMA|HMMA|F2FP)(?:\.[\w.]+)?)", code)
    return {op: ops.count(op) for op in sorted(set(ops))}
