"""Static scan: the cheapest audit stage, and a second line of defence (the candidate already runs in a separate,
sandboxed process). An AST allowlist: node types, imported modules and the names taken from them, decorators and
assignment targets are allowed by list; attributes and builtins that reach the interpreter, files, the judge's
timer or global state are refused wherever they appear. Every refusal names its line and construct."""

from __future__ import annotations

import ast

from tik_evo.family import Check
from tik_evo.knobs import KnobsError, read_knobs


def _words(text: str) -> set[str]:
    return set(text.split())


# triton.language.extra.cuda: device intrinsics (libdevice, grid-dependency control), nothing host-side.
# Gluon (Triton's explicit-layout language) and its Hopper ops and host TMA descriptors: kernels, nothing else.
# tik_evo.launch: the fast launch path (it calls the compiled kernel Triton built; no timing, no results).
ALLOWED_IMPORTS = {"tik_evo.launch", "torch", "triton", "triton.language", "triton.language.extra.cuda", "math",
                   "functools", "typing", "__future__", "triton.experimental", "triton.experimental.gluon",
                   "triton.experimental.gluon.language", "triton.experimental.gluon.language.nvidia.hopper",
                   "triton.experimental.gluon.nvidia.hopper"}
# Modules allowed name by name (others: every name the other rules let through). tik_evo.launch is the engine's:
# its launch helpers only, never its switches (ENABLED), caches or imports.
ALLOWED_NAMES = {"tik_evo": {"launch"}, "tik_evo.launch": {"fast", "cdiv", "pow2"}, "__future__": {"annotations"},
                 "functools": {"partial", "reduce"},  # no caches: results are computed, not remembered
                 "typing": _words("Any Optional Union Callable Sequence Iterable Tuple List Dict TYPE_CHECKING cast")}
# Attribute names refused anywhere (through any alias or object), by what they reach.
FORBIDDEN_ATTRS = _words("""
    sys os modules builtins subprocess socket ctypes threading multiprocessing gc inspect importlib pickle marshal io
    shutil pathlib signal atexit traceback types weakref code runpy torch triton environ getenv system popen spawn
    f_back f_globals f_locals f_builtins f_code gi_frame gi_code gi_yieldfrom cr_frame cr_code ag_frame tb_frame
    tb_next cell_contents format format_map
""")  # modules (each re-exports its imports: typing.sys, torch.os), frames; format: "{0.__globals__}".format(f)
FORBIDDEN_ATTRS |= _words("""
    time perf_counter perf_counter_ns monotonic process_time datetime Stream stream ExternalStream StreamContext
    set_stream default_stream Event elapsed_time synchronize wait_stream wait_event record_event record_stream query
    graph graphs CUDAGraph graph_pool_handle make_graphed_callables is_current_stream_capturing do_bench
    do_bench_cudagraph testing benchmark profiler cudart nvtx globaltimer autotune Autotuner
""")  # the judge's timing, or telling timed runs apart: clocks, streams, events, graphs, benchmarks
FORBIDDEN_ATTRS |= _words("""
    load_library cpp_extension hub library ops classes package serialization model_zoo from_file save tofile dump
    compile compiler fx export tools backends distributed CUDAPluggableAllocator change_current_allocator tunable gds
    _C _dynamo knobs driver runtime
""")  # files, shared libraries, code from strings, other compilers; Triton's hooks, flags and launchers
FORBIDDEN_ATTRS |= _words("""
    set_float32_matmul_precision set_default_dtype set_default_device set_default_tensor_type set_flush_denormal
    use_deterministic_algorithms manual_seed manual_seed_all seed set_rng_state set_device
""")  # global numerics, RNG and device the reference computation relies on
FORBIDDEN_PATHS = ("torch.load", "torch.jit")  # names too common to refuse anywhere (tl.load, triton.jit)
PATH_EXCEPTIONS = {"runtime": "triton.runtime.errors"}  # attention raises OutOfResources as Triton does
PRIVATE_OK = {"_reinterpret"}  # attention: Gluon's shared-memory view, on a kernel-local buffer
ALLOWED_DUNDERS = {"__name__", "__doc__"}  # read only; rope: type(x).__name__ in an error message
DUNDER_METHODS = {"__init__", "__getitem__", "__call__"}  # attention's descriptor record and launcher
DECORATORS = {"triton.jit", "triton.experimental.gluon.jit"}
JIT_KEYWORDS = {"do_not_specialize", "do_not_specialize_on_alignment", "noinline"}  # no hooks (launch_metadata)
# Builtins that turn strings into names or code, reach frames, files or the terminal, or make classes.
FORBIDDEN_BUILTINS = _words("""eval exec compile globals locals vars dir getattr setattr delattr hasattr open input
    breakpoint memoryview exit quit help super classmethod staticmethod property""")
ALLOWED_NODES = tuple(getattr(ast, n) for n in _words("""Module Expr Assign AnnAssign AugAssign Delete FunctionDef
    ClassDef Return If For While Break Continue Pass Raise Try ExceptHandler Assert With withitem Import ImportFrom
    Lambda IfExp BoolOp BinOp UnaryOp Compare Call keyword Attribute Subscript Slice Starred Name Constant List Tuple
    Dict Set ListComp SetComp DictComp GeneratorExp comprehension JoinedStr FormattedValue NamedExpr arguments arg
    expr_context operator unaryop boolop cmpop"""))  # not: global, nonlocal, yield, await, async, match


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """`a.b.c` -> (a, ["b", "c"])."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return node, parts[::-1]


class _Scope:
    """The names a module or function binds; for each, the dotted paths it may stand for (imports, and names
    assigned a chain of one: `c = torch.cuda`, resolved on entry), and whether an import binds it. Class bodies and
    comprehensions count as the enclosing scope: more bound names, never fewer checks (shadowing is exact only for
    function locals, where Python's is static)."""

    def __init__(self, node: ast.AST):
        a = node.args if not isinstance(node, ast.Module) else None
        self.bound = {x.arg for x in (a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if a else []) if x}
        self.paths: dict[str, set[str]] = {}
        self.imported: set[str] = set()
        self.pairs: list[tuple[str, ast.expr]] = []
        todo = list(node.body) if isinstance(node.body, list) else [node.body]
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.Lambda)):  # own scope; decorators and defaults run here
                todo += [*getattr(n, "decorator_list", []), *n.args.defaults, *filter(None, n.args.kw_defaults)]
            elif isinstance(n, ast.comprehension):  # the target is the comprehension's own
                todo += [n.iter, *n.ifs]
            else:
                todo += ast.iter_child_nodes(n)
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                for x in n.names:
                    name = x.asname or x.name.split(".")[0]
                    path = f"{n.module}.{x.name}" if isinstance(n, ast.ImportFrom) else x.asname and x.name or name
                    self.paths.setdefault(name, set()).add(path)
                    self.imported.add(name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    pairs = zip(t.elts, n.value.elts) if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) \
                        and len(t.elts) == len(n.value.elts) else [(t, n.value)]
                    self.pairs += [(x.id, v) for x, v in pairs if isinstance(x, ast.Name)]
            elif isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.ExceptHandler)) and n.name:
                self.bound.add(n.name)
            elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                self.bound.add(n.id)
        self.bound |= self.imported


class _Scan(ast.NodeVisitor):
    def __init__(self, tree: ast.Module):
        self.problems: list[str] = []
        self.scopes: list[_Scope] = []
        self.stack: list[ast.AST | None] = [None, None]  # nodes being visited: a node's parent is stack[-2]
        self.classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.self_name: str | None = None  # a method's first parameter, while its body is scanned

    def bad(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    def visit(self, node: ast.AST) -> None:
        self.stack.append(node)
        super().visit(node)
        self.stack.pop()

    def generic_visit(self, node: ast.AST) -> None:
        if not isinstance(node, ALLOWED_NODES):
            return self.bad(node, f"{type(node).__name__} not allowed")
        super().generic_visit(node)

    def lookup(self, name: str) -> tuple[int, set[str], bool]:
        """(index of the innermost scope binding `name`, or -1; its paths; whether an import binds it)."""
        for i in range(len(self.scopes) - 1, -1, -1):
            if name in self.scopes[i].bound:
                return i, self.scopes[i].paths.get(name, set()), name in self.scopes[i].imported
        return -1, set(), False

    def enter(self, node: ast.AST, body: list[ast.AST], self_name: str | None = None) -> None:
        scope, outer = _Scope(node), self.self_name
        self.scopes.append(scope)
        # Aliases of aliases, a few deep and a few paths a name (`x = x.a` would grow forever). A path dropped costs
        # little: every attribute name is still checked, only module-qualified rules (torch.load) need the path.
        for _ in range(4):
            for target, value in scope.pairs:
                root, parts = _chain(value)
                if isinstance(root, ast.Name):
                    known = scope.paths.setdefault(target, set())
                    known |= set(sorted({".".join([p, *parts]) for p in self.lookup(root.id)[1]})[:8 - len(known)])
        self.self_name = self_name
        for n in body:
            self.visit(n)
        self.scopes.pop()
        self.self_name = outer

    def in_annotation(self) -> bool:
        return any(c is getattr(p, "annotation", None) or c is getattr(p, "returns", None)
                   for p, c in zip(self.stack[2:], self.stack[3:]))

    def path(self, node: ast.AST, path: str) -> None:
        """A dotted path from an import: the module's allowed names, forbidden paths, then every name in it."""
        mod = max((m for m in ALLOWED_NAMES if path.startswith(m + ".")), key=len, default=None)
        if mod is not None and path[len(mod) + 1:].split(".")[0] not in ALLOWED_NAMES[mod]:
            self.bad(node, f"{path} (only {', '.join(sorted(ALLOWED_NAMES[mod]))} of {mod})")
        if any(_under(path, p) for p in FORBIDDEN_PATHS):
            self.bad(node, f"forbidden {path}")
        for name in path.split(".")[1:]:
            if not (name in PATH_EXCEPTIONS and _under(path, PATH_EXCEPTIONS[name])):
                self.attr(node, name, path, False)

    def attr(self, node: ast.AST, name: str, text: str, own: bool) -> None:
        if _dunder(name) and name not in ALLOWED_DUNDERS:
            self.bad(node, f"dunder attribute .{name} in {text}")
        elif name in FORBIDDEN_ATTRS:
            self.bad(node, f"forbidden attribute .{name} in {text}")
        elif name.startswith("_") and not _dunder(name) and not own and name not in PRIVATE_OK:
            self.bad(node, f"private attribute .{name} in {text}")

    def visit_Module(self, node: ast.Module) -> None:
        self.enter(node, node.body)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        if any((a.asname or a.name.split(".")[0]) == self.self_name for a in node.names):
            self.bad(node, f"rebinding {self.self_name}, a method's self, by an import")
        for a in node.names:
            if isinstance(node, ast.Import) and a.name not in ALLOWED_IMPORTS:
                self.bad(node, f"import {a.name}")
            elif isinstance(node, ast.ImportFrom) and (node.level or node.module not in ALLOWED_IMPORTS):
                return self.bad(node, f"from {'.' * node.level}{node.module or ''} import ...")
            elif isinstance(node, ast.ImportFrom) and a.name == "*":
                self.bad(node, f"from {node.module} import *")
            elif isinstance(node, ast.ImportFrom):
                self.path(node, f"{node.module}.{a.name}")

    visit_ImportFrom = visit_Import

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root, parts = _chain(node)
        text = ast.unparse(node)[:80]
        name = root.id if isinstance(root, ast.Name) else None
        is_self = name is not None and name == self.self_name
        if isinstance(node.ctx, (ast.Store, ast.Del)) and not (is_self and len(parts) == 1):
            self.bad(node, f"assignment to attribute {text} (only self.<name> in a method)")
        paths = self.lookup(name)[1] if name else set()
        for p in paths:
            self.path(node, ".".join([p, *parts]))
        for i, part in enumerate([] if paths else parts):
            self.attr(node, part, text, is_self and i == 0)
        if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "type" \
                and parts[0] != "__name__":
            self.bad(node, f"{text}: only type(x).__name__ (a class's methods take any object as self)")
        if name in self.classes:
            self.bad(node, f"class attribute {text} (methods are called on instances)")
        if name:
            self.name(root, None, None)
        else:
            self.visit(root)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        base = node.value
        while isinstance(base, ast.Subscript):
            base = base.value
        root, parts = _chain(base)
        own = isinstance(root, ast.Name) and (root.id == self.self_name if parts else not self.lookup(root.id)[1])
        if isinstance(node.ctx, (ast.Store, ast.Del)) and (not own or len(parts) > 1):
            self.bad(node, f"assignment to item of {ast.unparse(base)[:80]} (only names of this file)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self.name(node, self.stack[-2], self.stack[-3])

    def name(self, node: ast.Name, parent: ast.AST | None, grand: ast.AST | None) -> None:
        """A name; `parent` None for the root of an attribute chain (whose attributes are checked instead)."""
        name, load = node.id, isinstance(node.ctx, ast.Load)
        called = isinstance(parent, ast.Call) and parent.func is node
        if _dunder(name) and (name not in ALLOWED_DUNDERS or not load):
            self.bad(node, f"dunder name {name}")
        elif name in FORBIDDEN_BUILTINS:
            self.bad(node, f"builtin {name}")
        elif name == "type" and not (called and len(parent.args) == 1 and not parent.keywords
                                     and isinstance(grand, (ast.Compare, ast.Attribute))):
            self.bad(node, "type() other than `type(x) is C` or type(x).__name__")
        elif name == self.self_name and not load:
            self.bad(node, f"rebinding {name}, a method's self")
        if parent is None or isinstance(parent, ast.Compare) or called or not load:
            return
        # Classes and imported modules are never values: no method gets another self, no module another name.
        if (name in self.classes
                and not (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
                         and parent.func.id in ("isinstance", "issubclass"))
                and not self.in_annotation()):
            self.bad(node, f"class {name} used as a value (only called, compared or in isinstance)")
        elif self.lookup(name)[2] and not self.in_annotation():
            self.bad(node, f"imported {name} used as a value (only called, compared or its attributes read)")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and self.in_annotation():  # Triton reads annotations' text
            self.bad(node, f"string annotation {node.value[:40]!r}")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        in_class = isinstance(self.stack[-2], ast.ClassDef)
        if _dunder(node.name) and not (in_class and node.name in DUNDER_METHODS):
            self.bad(node, f"def {node.name}")
        for d in node.decorator_list:
            call = d if isinstance(d, ast.Call) else None
            root, parts = _chain(call.func if call else d)
            paths = self.lookup(root.id)[1] if isinstance(root, ast.Name) else set()
            if not paths or any(".".join([p, *parts]) not in DECORATORS for p in paths) or (call and (
                    call.args or any(k.arg not in JIT_KEYWORDS for k in call.keywords))):
                self.bad(d, f"decorator @{ast.unparse(d)[:80]} (only triton.jit and gluon.jit)")
            self.visit(d)
        self.visit(node.args)
        if node.returns:
            self.visit(node.returns)
        # Attributes are set on a method's self only: an instance of a class of this file (classes are never
        # values, so no method is called with another self).
        method = in_class and node.args.args and not node.decorator_list
        self.enter(node, node.body, node.args.args[0].arg if method else None)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self.enter(node, [node.body])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.bases or node.keywords or node.decorator_list or len(self.scopes) > 1:
            self.bad(node, f"class {node.name} with bases, keywords or decorators, or in a function")
        self.generic_visit(node)


def scan(source: str, entry_points: tuple[str, ...], knob_names: tuple[str, ...] = ()) -> list[Check]:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Check("parses", False, "static", {"error": f"line {e.lineno}: {e.msg}"})]
    visitor = _Scan(tree)
    visitor.visit(tree)
    problems = list(dict.fromkeys(visitor.problems))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [e for e in entry_points if e not in defined]
    out = [Check("parses", True, "static"),
           Check("allowed constructs only", not problems, "static", {"violations": problems[:20]}),
           Check("entry points defined", not missing, "static", {"missing": missing})]
    try:
        knobs = read_knobs(source)
        unknown = [k for k in knob_names if k not in knobs]
        out.append(Check("KNOBS dict", True, "static", {"knobs": knobs, "absent_knobs": unknown}))
    except KnobsError as e:
        out.append(Check("KNOBS dict", not knob_names, "static", {"error": str(e)}))
    return out
