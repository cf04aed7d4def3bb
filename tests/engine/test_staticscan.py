"""The static scan, an AST allowlist: every kernel file passes (each root, each named knob set of a family's
sets.yaml); each known way around it is refused with a message naming the construct."""

import textwrap

import pytest

from tik_evo.families import available, load_family
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo.staticscan import scan

FAMILIES = {name: load_family(name) for name in available()}
RMS = FAMILIES["rmsnorm"]
ROOT = RMS.root_source()
DOC = '    """One token per sequence: x [batch, hidden]; same per-row numerics as rmsnorm_full."""\n'


def failed(source: str, family=RMS) -> list:
    return [c for c in scan(source, family.entry_points, tuple(k.name for k in family.knobs)) if not c.passed]


def violations(source: str) -> list[str]:
    return next(c for c in scan(source, RMS.entry_points) if c.name == "allowed constructs only").details["violations"]


ROOTS = {name: fam.root_source() for name, fam in FAMILIES.items()}
ROOT_KNOBS = {name: read_knobs(src) for name, src in ROOTS.items()}


def with_knobs(family, changes: dict) -> str:
    return write_knobs(ROOTS[family.name], {**ROOT_KNOBS[family.name], **changes})


@pytest.mark.parametrize("family,name", [(f, n) for f, fam in FAMILIES.items()
                                         for n in ["root", *fam.named_sets()]])
def test_every_root_and_named_set_passes(family, name):
    fam = FAMILIES[family]
    changes = {} if name == "root" else fam.named_sets()[name]
    assert failed(with_knobs(fam, changes), fam) == []


def body(code: str) -> str:
    """The rmsnorm root with `code` at the start of rmsnorm_decode's body."""
    assert DOC in ROOT
    return ROOT.replace(DOC, DOC + textwrap.indent(textwrap.dedent(code).strip("\n") + "\n", "    "))


def module(code: str) -> str:
    """The rmsnorm root with `code` at module level (after its imports)."""
    return ROOT.replace("\nKNOBS = {", textwrap.dedent(code).strip("\n") + "\n\nKNOBS = {", 1)


HOSTILE = {
    # modules reached through other modules' attributes
    "typing.sys.modules": (module("import typing\ntyping.sys.modules['x'] = None"), ".sys in typing.sys"),
    "torch.os": (body("torch.os.system('true')"), ".os in torch.os"),
    "torch.sys": (body("m = torch.sys.modules"), ".sys in torch.sys"),
    "launch.torch": (module("import tik_evo.launch as launch\nlaunch.torch.load('w')"), "tik_evo.launch.torch"),
    "alias of a chain": (body("c = torch.cuda\nc.synchronize()"), ".synchronize in torch.cuda.synchronize"),
    # names built from strings
    "vars(...)[...] =": (body("vars(torch.cuda)['synchronize'] = fast"), "builtin vars"),
    "getattr": (body("f = getattr(torch, 'lo' + 'ad')"), "builtin getattr"),
    "bare getattr": (body("g = getattr"), "builtin getattr"),
    "hasattr": (body("hasattr(torch, 'x')"), "builtin hasattr"),
    "__import__": (body("__import__('os').abort()"), "dunder name __import__"),
    "importlib": (module("import importlib"), "import importlib"),
    "from importlib": (module("from importlib import import_module"), "from importlib import ..."),
    "type name format": (body("s = type(x).__name__.format(x)"), ".format"),
    "dunder store": (module("__name__ = 'torch'"), "dunder name __name__"),
    "str.format": (body("'{0.__globals__}'.format(fast)"), ".format"),
    "eval": (body("eval('1')"), "builtin eval"),
    "exec": (body("exec('x = 1')"), "builtin exec"),
    "compile": (body("compile('1', 'f', 'eval')"), "builtin compile"),
    "globals": (body("globals()['KNOBS'] = {}"), "builtin globals"),
    "type 3-arg": (body("T = type('T', (), {})"), "type() other than"),
    "string annotation": (module("def f(x: 'tl.constexpr'):\n    return x"), "string annotation"),
    # frames, tracebacks, generators
    "sys._getframe": (body("f = torch.sys._getframe(1)"), ".sys in torch.sys._getframe"),
    "f_back": (body("f = x.f_back"), ".f_back"),
    "f_globals": (body("f = x.f_globals"), ".f_globals"),
    "gi_frame": (body("g = (i for i in ()).gi_frame"), ".gi_frame"),
    "tb_frame": (body("f = x.tb_frame"), ".tb_frame"),
    "cr_frame": (body("f = x.cr_frame"), ".cr_frame"),
    "__traceback__": (body("f = x.__traceback__"), "dunder attribute .__traceback__"),
    "__subclasses__": (body("s = ().__class__.__mro__[1].__subclasses__()"), "dunder attribute .__class__"),
    "__builtins__": (module("import functools\nfunctools.__builtins__['open']('f')"), ".__builtins__"),
    "__code__": (body("c = rmsnorm_full.__code__"), "dunder attribute .__code__"),
    "yield": (module("def g():\n    yield 1"), "Yield not allowed"),
    "async": (module("async def g():\n    pass"), "AsyncFunctionDef not allowed"),
    # telling the audit's timing apart, or changing it
    "is_current_stream_capturing": (body("if torch.cuda.is_current_stream_capturing():\n    return"),
                                    ".is_current_stream_capturing"),
    "Stream": (body("s = torch.cuda.Stream()"), ".Stream"),
    "stream ctx": (body("with torch.cuda.stream(s):\n    pass"), ".stream"),
    "Event": (body("e = torch.cuda.Event(enable_timing=True)"), ".Event"),
    "graph": (body("with torch.cuda.graph(g):\n    pass"), ".graph"),
    "CUDAGraph": (body("g = torch.cuda.CUDAGraph()"), ".CUDAGraph"),
    "synchronize": (body("torch.cuda.synchronize()"), ".synchronize"),
    "import time": (module("import time"), "import time"),
    "perf_counter": (module("from time import perf_counter"), "from time import ..."),
    "triton.testing": (body("triton.testing.do_bench(fast)"), ".testing in triton.testing"),
    "from triton import testing": (module("from triton import testing"), ".testing in triton.testing"),
    "triton.runtime.driver": (body("d = triton.runtime.driver.active"), ".runtime in triton.runtime.driver"),
    "triton.runtime.errors.sys": (body("m = triton.runtime.errors.sys"), ".sys in triton.runtime.errors.sys"),
    "triton.knobs": (body("triton.knobs.runtime.launch_enter_hook = None"), ".knobs"),
    "globaltimer": (module("import triton.language.extra.cuda as cu\nt = cu.globaltimer"), ".globaltimer"),
    "manual_seed": (body("torch.manual_seed(0)"), ".manual_seed"),
    "matmul precision": (body("torch.set_float32_matmul_precision('medium')"), ".set_float32_matmul_precision"),
    # files, processes, loading code
    "tofile": (body("x.numpy().tofile('x.bin')"), ".tofile"),
    "torch.fx": (body("g = torch.fx.symbolic_trace(fast)"), ".fx in torch.fx"),
    "pluggable allocator": (body("a = torch.cuda.memory.CUDAPluggableAllocator('x.so', 'a', 'f')"),
                            ".CUDAPluggableAllocator"),
    "open": (body("open('/etc/passwd')"), "builtin open"),
    "torch.load": (body("w = torch.load('w.pt')"), "forbidden torch.load"),
    "from torch import load": (module("from torch import load"), "forbidden torch.load"),
    "torch.jit": (body("f = torch.jit.script(fast)"), "forbidden torch.jit"),
    "torch.hub": (body("m = torch.hub.load('a', 'b')"), ".hub"),
    "cpp_extension": (body("torch.utils.cpp_extension.load_inline('m', '')"), ".cpp_extension"),
    "load_library": (body("torch.ops.load_library('x.so')"), ".load_library"),
    "torch.library": (body("lib = torch.library.Library('aten', 'IMPL')"), ".library"),
    "torch._C": (body("torch._C._cuda_synchronize()"), "._C in torch._C"),
    "torch._dynamo": (body("torch._dynamo.reset()"), "._dynamo"),
    "torch.compile": (body("f = torch.compile(fast)"), ".compile"),
    **{f"import {m}": (module(f"import {m}"), f"import {m}")
       for m in ("os", "sys", "subprocess", "socket", "ctypes", "threading", "multiprocessing", "gc", "inspect",
                 "builtins", "pickle", "marshal", "torch.cuda")},
    "relative import": (module("from . import x"), "from . import ..."),
    "star import": (module("from triton import *"), "from triton import *"),
    # the engine: tik_evo.launch's public helpers only
    "tik_evo.timing": (module("from tik_evo import timing"), "from tik_evo import ..."),
    "tik_evo.audit via package": (module("import tik_evo.launch\nx = tik_evo.audit"), "tik_evo.audit (only launch"),
    "launch.ENABLED": (module("import tik_evo.launch as launch\nlaunch.ENABLED = False"),
                       "assignment to attribute launch.ENABLED"),
    "from launch import ENABLED": (module("from tik_evo.launch import ENABLED"), "tik_evo.launch.ENABLED (only"),
    "launch._LAUNCHERS": (module("from tik_evo.launch import _LAUNCHERS"), "tik_evo.launch._LAUNCHERS"),
    "private attribute": (body("torch.cuda._lazy_init()"), "private attribute ._lazy_init"),
    "private anywhere": (body("k = fast(_rms_rows_kernel)._launch"), "private attribute ._launch"),
    # assignments to module state
    "torch.cuda.synchronize =": (module("torch.cuda.synchronize = lambda: None"),
                                 "assignment to attribute torch.cuda.synchronize"),
    "do_bench =": (module("triton.testing.do_bench = fast"), "assignment to attribute triton.testing.do_bench"),
    "elapsed_time =": (module("torch.cuda.Event.elapsed_time = fast"), "assignment to attribute torch.cuda.Event"),
    "plain module attr": (body("torch.nn.functional.gelu = fast"), "assignment to attribute torch.nn.functional"),
    "tl attr": (module("tl.sum = tl.max"), "assignment to attribute tl.sum"),
    "del": (module("del torch.empty"), "assignment to attribute torch.empty"),
    "augmented": (body("torch.x += 1"), "assignment to attribute torch.x"),
    "aliased module attr": (body("c = torch.cuda\nc.current_device = fast"), "assignment to attribute c.current"),
    "setattr": (body("setattr(torch.cuda, 'current_device', fast)"), "builtin setattr"),
    "__dict__": (body("torch.cuda.__dict__['current_device'] = fast"), "dunder attribute .__dict__"),
    "item of a module alias": (body("c = torch.cuda\nc['x'] = 1"), "assignment to item of c"),
    "item of an attribute": (body("fast(_rms_rows_kernel).kernels['k'] = 1"), "assignment to item of fast("),
    "for target": (body("for torch.x in range(2):\n    pass"), "assignment to attribute torch.x"),
    "global": (body("global torch\ntorch = None"), "Global not allowed"),
    "nonlocal": (module("def f():\n    x = 1\n    def g():\n        nonlocal x\n    return g"), "Nonlocal not allowed"),
    # classes: plain records only
    "metaclass": (module("class C(metaclass=type):\n    pass"), "class C with bases"),
    "base class": (module("class C(torch.Tensor):\n    pass"), "class C with bases"),
    "__getattr__": (module("class C:\n    def __getattr__(self, n):\n        return n"), "def __getattr__"),
    "__init_subclass__": (module("class C:\n    def __init_subclass__(cls):\n        pass"), "def __init_subclass__"),
    "module __getattr__": (module("def __getattr__(n):\n    return n"), "def __getattr__"),
    "method called with a module": (module("class C:\n    def set(self, v):\n        self.x = v\n\n\n"
                                           "C.set(torch.cuda, 1)"), "class attribute C.set"),
    "method through type()": (module("class C:\n    def set(self, v):\n        self.x = v\n\n\n"
                                     "type(C()).set(torch.cuda, 1)"), "only type(x).__name__"),
    "class as a value": (module("class C:\n    pass\n\n\nD = C"), "class C used as a value"),
    "self rebound": (module("class C:\n    def set(self, v):\n        self = torch.cuda\n        self.x = v"),
                     "rebinding self"),
    "nested self": (module("class C:\n    def set(self, v):\n        def g(s):\n            s.x = v\n"
                           "        return g"), "assignment to attribute s.x"),
    "self by an import": (module("class C:\n    def set(self, v):\n        import torch as self\n        self.x = v"),
                          "rebinding self, a method's self, by an import"),
    "class in an if": (module("if True:\n    class C:\n        def set(self, v):\n            self.x = v\n"
                              "C.set(torch.cuda, 1)"), "class attribute C.set"),
    "class in a function": (body("class C:\n    pass"), "class C with bases, keywords or decorators, or in a function"),
    "staticmethod": (module("class C:\n    @staticmethod\n    def set(m):\n        m.x = 1"),
                     "decorator @staticmethod"),
    # decorators: triton.jit and gluon.jit only
    "lru_cache": (module("import functools\n\n\n@functools.lru_cache\ndef f(x):\n    return x"),
                  "decorator @functools.lru_cache"),
    "autotune": (module("@triton.autotune(configs=[], key=[])\ndef f(x):\n    return x"), "decorator @triton.autotune"),
    "jit hook": (module("@triton.jit(launch_metadata=fast)\ndef f(x):\n    return x"), "decorator @triton.jit(launch"),
    "own decorator": (module("@fast\ndef f(x):\n    return x"), "decorator @fast"),
    # modules passed around as values (then reached by parameter names the scan cannot follow)
    "module as argument": (body("f = (lambda m: m.load('w'))(torch)"), "imported torch used as a value"),
    "module as default": (body("f = lambda m=torch: m.load('w')"), "imported torch used as a value"),
    "module in a list": (body("m = [torch][0]"), "imported torch used as a value"),
    "module alias": (module("t = torch"), "imported torch used as a value"),
    "comprehension shadow": (body("m = [torch for torch in (1,)] and torch"), "imported torch used as a value"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_candidate_refused_naming_the_construct(case):
    source, construct = HOSTILE[case]
    assert source != ROOT
    found = violations(source)
    assert any(construct in v for v in found), found
    assert all(v.startswith("line ") for v in found)


def test_messages_name_the_line():
    src = body("torch.cuda.synchronize()")
    line = src.splitlines().index("    torch.cuda.synchronize()") + 1
    assert violations(src) == [f"line {line}: forbidden attribute .synchronize in torch.cuda.synchronize"]


def test_what_the_roots_need_stays_allowed():
    ok = body("""
        key = torch.cuda.current_stream(x.device).cuda_stream
        e = triton.runtime.errors.OutOfResources
        name = type(x).__name__
        launch = KNOBS["NUM_WARPS"] * 2
        """) + module("""
        class Rec:
            def __init__(self, base):
                self.base, self._seen = base, {}

            def __getitem__(self, grid):
                return lambda *a: self.base


        _CACHE: dict = {}
        _CACHE[0] = Rec(1) if type(1) is int else None
        """)
    assert violations(ok) == []


def test_parse_error_and_missing_entry_point():
    assert [c.name for c in failed("def (:\n")] == ["parses"]
    bad = failed(ROOT.replace("def rmsnorm_decode(", "def renamed("))
    assert [c.name for c in bad] == ["entry points defined"]
