"""Campaign configuration: OmegaConf structured configs, one dataclass per section.

``load_campaign(path, overrides)`` merges the YAML file and dotted command-line overrides onto the schema;
unknown keys, wrong types and missing files raise :class:`ConfigError` naming the file and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

SAMPLERS = ("tpe", "random", "nsga2", "bruteforce")
SPACES = ("family", "flat")  # search.space
GPU_POLICIES = ("warn", "refuse", "interpret")
DEVICES = ("auto", "cuda", "interpreter")


class ConfigError(ValueError):
    pass


# `${now:%Y%m%d-%H%M%S}` in a campaign (e.g. store.path) gives each run its own directory.
if not OmegaConf.has_resolver("now"):
    OmegaConf.register_resolver("now", lambda fmt="%Y%m%d-%H%M%S": datetime.now().strftime(fmt), use_cache=True,
                                annotation_validation="off")


@dataclass
class GPUConfig:
    name: str = "any"  # the GPU the campaign was written for (H200, H20, A100, any)
    policy: str = "warn"  # when the real GPU differs: warn (run, record it) | refuse | interpret


@dataclass
class WorkloadsConfig:
    file: str = MISSING  # relative to the campaign file
    default_weight: float = 1.0
    default_limit: float = 1.05  # t_j <= limit_j * t_j(root)
    overrides: dict[str, Any] = field(default_factory=dict)  # workload name -> {weight, limit}
    only: list[str] = field(default_factory=list)  # run a subset by name (empty: all)


@dataclass
class ObjectiveConfig:
    normalize: bool = False  # T = sum_j w_j t_j / t_j(root): one long workload cannot drown the rest
    noise_k: float = 2.0  # promotion margin = max(min_margin, noise_k * measured relative spread)
    min_margin: float = 0.005


@dataclass
class CorrectnessConfig:
    seeds: list[int] = field(default_factory=lambda: [0, 1])


@dataclass
class SearchConfig:
    sampler: str = "tpe"
    seed: int = 0
    operators: list[str] = field(default_factory=lambda: ["knob"])
    max_evaluations: int = 50  # audited offspring
    kappa_threshold: int = 30  # stop after this many consecutive non-improving audited offspring
    wall_time_s: float = 3600.0
    frontier_size: int = 8
    parent_patience: int = 4  # non-improving children in a row before a parent is archived
    reactivate_every: int = 6  # at every such multiple of kappa, reactivate the best archived implementation
    archive_factor: float = 1.25  # verified offspring slower than this x best go straight to the archive
    max_duplicates: int = 200  # proposals that repeat an existing source (not audited) before stopping
    split_bundles: bool = True  # retry each knob of a faster but over-limit multi-knob offspring alone
    neighbours: int = 32  # one-knob moves of each new best tried before the sampler's draws (0: none)
    # The opportunities seeded at initialization: `family` (the family's mechanisms, each a few knobs) or `flat`
    # (one opportunity naming every knob: plain sampling over the whole space, the baseline the engine must beat).
    space: str = "family"
    # Proposals that cross valleys; each is an arm of `tik-evo bench search`, off until measured there.
    stepping_stones: bool = False  # an over-limit offspring better on T than the best stays a parent (never promoted)
    constraints: bool = False  # limit overshoots told to the sampler as constraints (Optuna), not as a poor value
    multivariate: bool = False  # TPE models the knobs jointly, split into groups by the conditional space
    warm_start: list[str] = field(default_factory=list)  # named sets / earlier run dirs: their knobs tried first


@dataclass
class RayConfig:
    """`evaluate.executor=ray`: each audit a Ray task on a cluster (tik_evo.ray_executor, docs/campaigns.md)."""
    address: str = "auto"  # auto (the running cluster) | local (start one in this process) | a cluster address
    max_in_flight: int = 0  # audits in flight at most; 0: one per GPU of the cluster (x in_flight), or per CPU
    retries: int = 2  # a worker or node lost mid-audit: the audit runs again, this many times at most
    executor: str = "auto"  # how a task starts the audit's worker on its node: auto (forkserver) | spawn | forkserver
    scratch: str = ""  # each node's working directory for the run's audits; "": the node's temporary directory


@dataclass
class EvaluateConfig:
    timeout_s: float = 300.0
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    interpreter_reps: int = 3
    retime_best: bool = True  # time the current best in the same audit, on the same device
    gpu_index: int = 0
    # Audits at once, one per GPU: the root is audited on the first. Empty: one audit at a time on gpu_index.
    gpus: list[int] = field(default_factory=list)
    parallel: int = 1  # audits at once under the interpreter (CPU); on a GPU, list the GPUs in `gpus` instead
    # Audits in flight per GPU: each compiles ahead (`warm`) on the host's cores, one at a time holds the GPU.
    in_flight: int = 1
    warm: str = "auto"  # compile ahead with no GPU (tik_evo.warm): auto (a GPU, in_flight > 1) | on | off
    warm_timeout_s: float = 120.0  # a warm pass's limit (it is never a verdict: the audit compiles what is left)
    warm_capability: list[int] = field(default_factory=list)  # the target to compile for; []: the run's GPU's
    executor: str = "auto"  # auto | spawn (fresh interpreter per audit) | forkserver (imports once, forks) | ray
    ray: RayConfig = field(default_factory=RayConfig)
    check_procs: int = 0  # processes for the full correctness stage (0: half the CPUs, at most 8; 1: in-worker)
    graph_replay: str = "auto"  # the small cases again from CUDA-graph replays: auto (on a GPU) | on | off
    sandbox: str = "auto"  # the candidate's runner: auto (every protection the machine allows) | strict | off
    rounds: int = 5  # timed regions per workload, each on fresh inputs with its outputs checked (GPU)
    repeat_calls: int = 100  # repetitions of each entry point's first call, compared bit for bit (GPU)
    interpreter_repeat_calls: int = 2  # the same under the CPU interpreter (each call takes seconds there)
    # Screen: time an offspring right after the small checks and stop its audit there (kind "screened", never a
    # parent) when its objective is worse than the best's by more than screen_margin, or a workload is over its
    # slowdown limit by more than that; the rest (most of an audit: the full checks) is audited only for the
    # others. Off: every offspring gets every check.
    screen: bool = False
    screen_margin: float = 0.05


@dataclass
class StoreConfig:
    path: str = "runs/${name}"


@dataclass
class AblationConfig:
    numerical_requirements: bool = True  # show the family's requirements to LLM operators
    evidence: bool = True  # show audit evidence to LLM operators
    lineage_management: bool = True  # archive / reactivate / abandon decisions; off: always extend the best
    branch_exploration: bool = True  # keep verified non-best offspring as parents; off: frontier = {best}


@dataclass
class LLMModel:
    model: str = MISSING  # any litellm model string: anthropic/..., openai/..., hosted_vllm/...
    weight: float = 1.0
    api_base: str | None = None  # a local vLLM / Ollama / OpenAI-compatible server
    temperature: float = 0.7
    # Keys come from the environment only: litellm reads the provider's usual variable (ANTHROPIC_API_KEY,
    # OPENAI_API_KEY, ...); api_key_env names another variable (e.g. for one of several local servers).
    api_key_env: str | None = None
    # Prices for models litellm has no price for (local servers default to 0), USD per million tokens.
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None


@dataclass
class LLMConfig:
    models: list[LLMModel] = field(default_factory=list)
    timeout_s: float = 120.0  # per call
    total_timeout_s: float = 600.0  # per action, retries included
    max_retries: int = 3
    max_tokens: int = 0  # run budget in tokens (0: unlimited)
    max_usd: float = 0.0  # run budget in USD (0: unlimited)
    max_output_tokens: int = 8192
    answer: str = "edits"  # edits | file
    backoff_s: float = 2.0  # first wait after a 429 / 5xx; doubles per retry, never past total_timeout_s
    repair: bool = True  # one bounded retry when the answer does not compile or fails the static scan
    merge: bool = True  # let the scheduler pick merge actions (best + a merge-later implementation)
    lineage_entries: int = 24  # most recent tried actions shown in the prompt


@dataclass
class StartConfig:
    # Start the search from the family's root with these knob changes: a named set the family keeps (measured
    # configurations, e.g. attention's `hopper_bn128_tree_s512`), then `knobs` on top. Slowdown limits are
    # anchored to that start, which is audited like any root.
    set: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)


def start_label(start: Any) -> str:
    """A campaign's `start` (the config section or the run state's copy) in words: "SET + {knobs}", "" if none."""
    knobs = dict(start.get("knobs") or {})
    return " + ".join(x for x in (start.get("set") or "", str(knobs) if knobs else "") if x)


@dataclass
class Campaign:
    name: str = MISSING
    kernel: str = MISSING
    gpu: GPUConfig = field(default_factory=GPUConfig)
    device: str = "auto"
    workloads: WorkloadsConfig = field(default_factory=WorkloadsConfig)
    start: StartConfig = field(default_factory=StartConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    correctness: CorrectnessConfig = field(default_factory=CorrectnessConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    source_file: str = ""  # filled in by load_campaign: where the campaign came from


# Keys that look like credentials; a campaign file is copied into every run directory, so none may hold one.
_SECRET_KEY = re.compile(r"(^|[_-])(api[_-]?key|apikey|secret|password|passwd|access[_-]?token|auth[_-]?token|"
                         r"bearer)$", re.IGNORECASE)


def _find_secret(node: Any, where: str = "") -> str | None:
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{where}.{k}" if where else str(k)
            if _SECRET_KEY.search(str(k)):
                return key
            found = _find_secret(v, key)
            if found:
                return found
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found = _find_secret(v, f"{where}[{i}]")
            if found:
                return found
    return None


def _reject_secrets(node: Any, where: str) -> None:
    key = _find_secret(node)
    if key:
        raise ConfigError(f"{where}: key {key!r}: credentials must not be written in a campaign (it is copied "
                          f"into the run directory); export the key in the environment instead (litellm reads "
                          f"ANTHROPIC_API_KEY, OPENAI_API_KEY, ...) or name a variable with llm.models[i].api_key_env")


def _explain(e: OmegaConfBaseException, where: str) -> ConfigError:
    key = getattr(e, "full_key", None) or "?"
    msg = str(e).split("\n")[0]
    return ConfigError(f"{where}: key {key!r}: {msg}")


def load_campaign(path: str | Path, overrides: list[str] | None = None) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: campaign file not found")
    schema = OmegaConf.structured(Campaign)
    try:
        file_cfg = OmegaConf.load(path)
    except Exception as e:  # yaml errors come in several types
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    _reject_secrets(OmegaConf.to_container(file_cfg), str(path))
    try:
        cfg = OmegaConf.merge(schema, file_cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, str(path)) from e
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"command line: override {bad[0]!r} is not of the form key=value")
        _reject_secrets(OmegaConf.to_container(OmegaConf.from_dotlist(overrides)), "command-line override")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
        except OmegaConfBaseException as e:
            raise _explain(e, "command-line override") from e
    cfg.source_file = str(path.resolve())
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise _explain(e, str(path)) from e
    if missing:
        raise ConfigError(f"{path}: key {missing[0]!r} is required but missing")
    _validate(cfg, path)
    return cfg


def _choice(value: Any, allowed: tuple[str, ...], key: str, path: Path) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}: key {key!r}: {value!r} is not one of {list(allowed)}")


def _validate(cfg: DictConfig, path: Path) -> None:
    from tik_evo.operators import OPERATORS

    _choice(cfg.search.sampler, SAMPLERS, "search.sampler", path)
    _choice(cfg.search.space, SPACES, "search.space", path)
    _choice(cfg.gpu.policy, GPU_POLICIES, "gpu.policy", path)
    _choice(cfg.device, DEVICES, "device", path)
    _choice(cfg.evaluate.executor, ("auto", "spawn", "forkserver", "ray"), "evaluate.executor", path)
    _choice(cfg.evaluate.ray.executor, ("auto", "spawn", "forkserver"), "evaluate.ray.executor", path)
    for key in ("evaluate.ray.max_in_flight", "evaluate.ray.retries"):
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{path}: key {key!r}: {OmegaConf.select(cfg, key)}: must be 0 or more")
    if cfg.evaluate.executor == "ray":
        if not str(cfg.evaluate.ray.address).strip():
            raise ConfigError(f"{path}: key 'evaluate.ray.address': empty; auto, local or a cluster address")
        if list(cfg.evaluate.gpus) or cfg.evaluate.parallel > 1:
            raise ConfigError(f"{path}: keys 'evaluate.gpus' / 'evaluate.parallel': this host's devices; with "
                              f"evaluate.executor=ray the audits go to the cluster's GPUs (or CPUs), at most "
                              f"evaluate.ray.max_in_flight at once")
        from tik_evo.ray_executor import missing_ray

        if missing_ray():
            raise ConfigError(f"{path}: key 'evaluate.executor': {missing_ray()}")
    # YAML (and a command-line override) reads a bare on / off as a boolean, which the str field keeps as text.
    cfg.evaluate.graph_replay = {"True": "on", "False": "off"}.get(cfg.evaluate.graph_replay,
                                                                   cfg.evaluate.graph_replay)
    _choice(cfg.evaluate.graph_replay, ("auto", "on", "off"), "evaluate.graph_replay", path)
    _choice(cfg.evaluate.sandbox, ("auto", "strict", "off"), "evaluate.sandbox", path)
    for op in cfg.search.operators:
        _choice(op, tuple(OPERATORS), "search.operators", path)
    if not cfg.search.operators:
        raise ConfigError(f"{path}: key 'search.operators': at least one operator is needed")
    if "llm" in cfg.search.operators and not cfg.llm.models:
        raise ConfigError(f"{path}: key 'llm.models': the llm operator needs at least one model")
    if "llm" in cfg.search.operators:
        import importlib.util

        if importlib.util.find_spec("litellm") is None:
            raise ConfigError(f"{path}: key 'search.operators': the llm operator needs litellm; "
                              f"pip install 'tik-evo[llm]'")
    for i, m in enumerate(cfg.llm.models):
        if m.weight <= 0:
            raise ConfigError(f"{path}: key 'llm.models[{i}].weight': must be positive")
    _choice(cfg.llm.answer, ("edits", "file"), "llm.answer", path)
    for key in ("llm.timeout_s", "llm.total_timeout_s"):
        if OmegaConf.select(cfg, key) <= 0:
            raise ConfigError(f"{path}: key {key!r}: must be positive")
    if not cfg.correctness.seeds:
        raise ConfigError(f"{path}: key 'correctness.seeds': at least one seed is needed")
    if cfg.evaluate.parallel < 1:
        raise ConfigError(f"{path}: key 'evaluate.parallel': must be at least 1")
    if cfg.evaluate.in_flight < 1:
        raise ConfigError(f"{path}: key 'evaluate.in_flight': {cfg.evaluate.in_flight}: must be at least 1")
    _choice(cfg.evaluate.warm, ("auto", "on", "off"), "evaluate.warm", path)
    if not 0.0 <= cfg.evaluate.screen_margin < 1.0:
        raise ConfigError(f"{path}: key 'evaluate.screen_margin': {cfg.evaluate.screen_margin}: a fraction in [0, 1)")
    cap = list(cfg.evaluate.warm_capability)
    if cap and (len(cap) != 2 or any(c < 0 for c in cap)):
        raise ConfigError(f"{path}: key 'evaluate.warm_capability': {cap}: [major, minor] (e.g. [9, 0]) or []")
    gpus = list(cfg.evaluate.gpus)
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConfigError(f"{path}: key 'evaluate.gpus': {gpus}: device indices, each at most once")
    if cfg.evaluate.check_procs < 0:
        raise ConfigError(f"{path}: key 'evaluate.check_procs': must be 0 (auto) or a positive count")
    if cfg.search.neighbours < 0:
        raise ConfigError(f"{path}: key 'search.neighbours': must be 0 (off) or a positive count")
    for key in ("search.max_evaluations", "search.kappa_threshold", "search.frontier_size"):
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{path}: key {key!r}: must be at least 1")
    for key in ("evaluate.timeout_s", "search.wall_time_s", "workloads.default_weight", "workloads.default_limit"):
        if OmegaConf.select(cfg, key) <= 0:
            raise ConfigError(f"{path}: key {key!r}: must be positive")


def workloads_path(cfg: DictConfig) -> Path:
    return (Path(cfg.source_file).parent / cfg.workloads.file).resolve()


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
