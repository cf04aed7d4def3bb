"""tik_evo.launch: a compiled kernel is reused only for a launch key Triton itself would not tell apart."""

import inspect
from types import SimpleNamespace

import torch

from tik_evo import launch as fl


class _FakeKernel:
    """A compiled kernel as the fast launch sees it: a launcher, a function handle, packed metadata."""
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


class _FakeJit:
    """A JIT function as the fast launch sees it: Triton's own launch (which compiles), the argument names and
    parameters (`n` may be declared do_not_specialize)."""
    arg_names = ["X", "n", "scale", "BLOCK"]

    def __init__(self, value_free_n=False):
        self.signature = inspect.signature(lambda X, n, scale, BLOCK=16: None)
        self.params = [SimpleNamespace(do_not_specialize=value_free_n and name == "n", is_constexpr=name == "BLOCK")
                       for name in self.arg_names]
        self.triton_launches = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.triton_launches.append((grid, args, kw))
            return _FakeKernel()
        return run


def _launcher(monkeypatch, jit):
    monkeypatch.setattr(fl, "launch_device", lambda: 0)
    monkeypatch.setattr(fl, "launch_stream", lambda device: 77)
    launcher = fl.Launcher(jit)
    assert not launcher.fast  # not a JITFunction: always Triton's own path
    launcher.fast = True
    return launcher


def test_fast_launch_reuses_a_compiled_kernel_only_for_an_identical_key(monkeypatch):
    import triton

    jit = _FakeJit()
    launch = _launcher(monkeypatch, jit)
    x = torch.zeros(64)
    first = launch[(3,)](x, 32, 0.5)
    assert len(jit.triton_launches) == 1 and first.runs == []  # the key's first launch is Triton's
    again = launch[(4, 2)](x, 32, 0.25)  # a float's value is not specialised: same key
    assert again is first and len(jit.triton_launches) == 1
    assert first.runs == [(4, 2, 1, 77, "function", "metadata", None, None, None, x, 32, 0.25, 16)]
    # Anything Triton specialises on is a new key: an int's value, a tensor's alignment or dtype, a constexpr.
    for args, kw in (((x, 33, 0.5), {}), ((x[1:], 32, 0.5), {}), ((x.double(), 32, 0.5), {}),
                     ((x, 32, 0.5), {"BLOCK": 32})):
        launch[(1,)](*args, **kw)
    assert len(jit.triton_launches) == 5
    launch[(1,)](x, 32, 0.5, BLOCK=32)  # now known: passes its constexpr in order
    assert jit.triton_launches[-1][2] == {"BLOCK": 32} and len(jit.triton_launches) == 5
    # A launch hook (a profiler) or the module switched off: Triton's path every time.
    hook = lambda metadata: None  # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch[(1,)](x, 32, 0.5)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setattr(fl, "ENABLED", False)
    launch[(1,)](x, 32, 0.5)
    assert len(jit.triton_launches) == 7
    # A keyword that is not a constant (a tensor) is never replayed from a key: Triton's path every time.
    monkeypatch.setattr(fl, "ENABLED", True)
    launch[(1,)](x, 32, scale=0.5, BLOCK=16)
    launch[(1,)](x, 32, 0.5, BLOCK=x)
    launch[(1,)](x, 32, 0.5, BLOCK=x)
    assert len(jit.triton_launches) == 10
    # Under torch.compile's tracing: Triton's path, which the compiler knows.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    launch[(1,)](x, 32, 0.5)
    assert len(jit.triton_launches) == 11


def test_a_do_not_specialize_int_keys_only_what_triton_could_specialise(monkeypatch):
    # n declared do_not_specialize (linear's M): 17 and 33 share a kernel, so do 32 and 48; 1, a multiple of 16
    # and a 64-bit value each keep their own key.
    jit = _FakeJit(value_free_n=True)
    launch = _launcher(monkeypatch, jit)
    x = torch.zeros(64)
    first = launch[(1,)](x, 17, 0.5)
    assert launch[(1,)](x, 33, 0.5) is first and first.runs[-1][10] == 33
    sixteen = launch[(1,)](x, 32, 0.5)
    assert sixteen is not first and launch[(1,)](x, 48, 0.5) is sixteen
    launch[(1,)](x, 1, 0.5)
    launch[(1,)](x, 2 ** 33 + 1, 0.5)
    assert len(jit.triton_launches) == 4


def test_disabled_launches_take_tritons_path_with_full_descriptors():
    class Desc:  # a light descriptor record: Triton's path gets full()
        base, block_shape = torch.zeros(4), (1,)

        def full(self):
            return "full descriptor"

    jit = _FakeJit()
    fl.fast(jit, enabled=False)[(1,)](Desc(), 3, 0.5)
    assert jit.triton_launches[-1][1][0] == "full descriptor"
    assert fl.fast(jit) is fl.fast(jit)  # one Launcher per kernel


def test_kernel_sources_may_import_the_launcher_and_nothing_else_of_the_engine():
    from tik_evo.staticscan import scan

    def violations(header):
        src = header + "\nKNOBS = {}\n\ndef f_full(x):\n    return x\n\ndef f_decode(x):\n    return x\n"
        return [c.details for c in scan(src, ("f_full", "f_decode")) if c.name == "allowed constructs only"][0]

    assert violations("import tik_evo.launch as launch\n") == {"violations": []}
    assert violations("from tik_evo.launch import fast\n") == {"violations": []}
    assert violations("from tik_evo import timing\n")["violations"] == ["line 1: from tik_evo import ..."]


def test_a_kernel_file_used_without_tik_evo_launches_through_triton(monkeypatch):
    # `tik-evo kernel FAMILY -o file.py` hands out the root as one file for a trainer or an inference engine
    # that may not have tik-evo installed: its launches then go through Triton, same kernels, same results.
    import sys

    import triton

    from tik_evo.candidate import load_source
    from tik_evo.families import load_family

    monkeypatch.setitem(sys.modules, "tik_evo.launch", None)  # the import fails as if tik-evo were absent
    for name in ("silu_mul", "attention"):
        fam = load_family(name)
        alone = load_source(fam.root_source(), f"{name}_alone")
        if name == "attention":
            assert alone.launch is None and type(alone._fast(alone._prefill_kernel)).__name__ == "_TritonLaunch"
        else:
            assert alone.fast(alone._silu_mul_kernel) is alone._silu_mul_kernel and alone.cdiv is triton.cdiv
        case = fam.check_cases("small")[0]
        assert all(c.passed for c in fam.run_checks(alone, case, 0, "cpu")), name


def test_host_grid_arithmetic_matches_triton():
    # The roots compute their grids with tik_evo.launch's cdiv / pow2 (attention imports them as _cdiv / _pow2):
    # triton.cdiv and triton.next_power_of_2 cost microseconds a call. They must give Triton's values.
    import triton

    from tik_evo.candidate import load_source
    from tik_evo.families import load_family

    attention = load_source(load_family("attention").root_source(), "attention_host")
    for cdiv, pow2 in ((fl.cdiv, fl.pow2), (attention._cdiv, attention._pow2)):
        assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))
        assert all(pow2(n) == triton.next_power_of_2(n) for n in range(0, 600))
    linear = load_source(load_family("linear").root_source(), "linear_host")
    assert linear.cdiv is fl.cdiv and linear.pow2 is fl.pow2
