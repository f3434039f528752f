"""The seam's vocabulary: how a patch of 0.5.23 is changed (`Kind`), when (`Moment`), the
install units (`Group`), a row (`Patch`) and a relied-on symbol (`Dependency`). The rows
themselves are `patches.PATCHES` and `depends.DEPENDS`; `hooks.py` installs them and is
what the rest of the plugin imports; `groups_table()` is the install table UPSTREAM.md and
docs/architecture.md show (a test holds them equal). Imports nothing heavy."""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass

# rows name their implementation as "module:attr" relative to the plugin package
PLUGIN_PACKAGE = __package__.rpartition(".")[0]


def resolve(spec: str):
    """The object a row, predicate or preparation names as `module:attr` (`attr` may be
    dotted) under the plugin package, imported only now."""
    module, attr = spec.split(":")
    obj = importlib.import_module(f"{PLUGIN_PACKAGE}.{module}")
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Kind(str, enum.Enum):
    AROUND = "around"              # HookRegistry: fn(original, *args, **kwargs)
    AFTER = "after"                # HookRegistry: fn(result, *args, **kwargs)
    BEFORE = "before"              # HookRegistry: fn(*args, **kwargs)
    REPLACE = "replace"            # HookRegistry: the function replaced (by-name imports too)
    RESOLUTION = "resolution"      # register_resolution_hook(step): fn(server_args, previous)
    CALL = "call"                  # install() calls the implementation once per process
    SCOPED_GLOBAL = "scoped global"    # a module global swapped while one call runs
    INSTANCE = "instance"          # a method or attribute of one upstream object
    STEP_STATE = "step state"      # worker attributes swapped for one decode step
    IMPORT = "import"              # the import system (sys.meta_path, environment)
    PROCESS = "process setting"    # a process-wide setting of a library (torch), set by the code named


HOOK_KINDS = (Kind.AROUND, Kind.AFTER, Kind.BEFORE, Kind.REPLACE)
INSTALLED_BY_GROUP = (*HOOK_KINDS, Kind.RESOLUTION, Kind.CALL)


class Moment(str, enum.Enum):
    PLATFORM_IMPORT = "first `import sglang` (platform entry point)"
    REGISTER = "plugin entry point `register()`"
    RESOLUTION = "argument resolution (main process)"
    SCHEDULER_START = "scheduler start, before the model is built"
    WORKER_BEFORE = "`DominoDFlashWorker.__init__`, before 0.5.23's constructor"
    WORKER_AFTER = "`DominoDFlashWorker.__init__`, after 0.5.23's constructor"
    STEP = "every decode step"


@dataclass(frozen=True)
class Group:
    """Rows installed together, under one condition. A group with a `predicate` is installed
    by `hooks.install_moment(moment, context)` where the predicate holds of the moment's
    context (nothing at `register()`, the server's arguments at scheduler start, the worker
    being built in its constructor), after its
    `prepare` runs; both are `module:function` under `sglang_domino.sglang`. A group
    without one holds rows the code they name does itself (instance patches, per-step
    state, process settings)."""
    name: str
    moment: Moment
    processes: str
    when: str
    apply_now: bool = True  # False: `load_plugins()` applies them right after `register()`
    predicate: str = ""
    prepare: str = ""


EVERY_PROCESS = Group("every process", Moment.REGISTER, "every SGLang process", "plugin enabled", apply_now=False,
                      predicate="seam.hooks:always")
CPU_ENGINE = Group("cpu engine", Moment.REGISTER, "every SGLang process", "`--device cpu` (SGLANG_USE_CPU_ENGINE=1)",
                   predicate="cpu.platform:cpu_engine_on")
CPU_MODELS = Group("cpu model registry", Moment.SCHEDULER_START, "model-running processes", "`--device cpu`",
                   predicate="cpu.platform:cpu_engine_on")
CPU_STANDIN = Group("cpu stand-in", Moment.SCHEDULER_START, "model-running processes",
                    "the `sgl_kernel` stand-in is serving", predicate="cpu.hybrid.runtime:standin_serving")
CHECKPOINT_COMPAT = Group("checkpoint compat", Moment.WORKER_BEFORE, "schedulers", "always",
                          predicate="seam.hooks:always")
CPU_DFLASH = Group("cpu dflash", Moment.WORKER_BEFORE, "schedulers", "the target runs on CPU",
                   predicate="step.worker:runs_on_cpu")
DOMINO_ROLLOUT = Group("domino rollout", Moment.WORKER_AFTER, "schedulers", "a Domino draft",
                       predicate="step.worker:domino_draft")
B8_RESERVATION = Group("b8 reservation", Moment.WORKER_AFTER, "schedulers", "draft block wider than the verify window",
                       predicate="step.worker:draft_block_wider")
WORKER = Group("worker", Moment.WORKER_AFTER, "schedulers", "as stated per row (done by the worker)")
STEP = Group("step", Moment.STEP, "schedulers", "as stated per row (done by the worker)")
RESOLVE = Group("resolve", Moment.RESOLUTION, "main process", "as stated per row")
PLATFORM = Group("platform", Moment.PLATFORM_IMPORT, "every SGLang process", "`--device cpu`")
DISAGGREGATION = Group("disaggregation", Moment.SCHEDULER_START, "schedulers",
                       "`--disaggregation-mode prefill|decode`", predicate="seam.scheduler_start:disaggregated")
B8_STATE = Group("b8 state buffers", Moment.SCHEDULER_START, "schedulers",
                 "DFLASH with a draft block wider than the verify window", predicate="seam.scheduler_start:draft_block_wider")
CPU_DISAGGREGATION = Group("cpu disaggregation", Moment.SCHEDULER_START, "schedulers",
                           "`--disaggregation-mode prefill|decode` with `--device cpu`",
                           predicate="seam.scheduler_start:disaggregated_on_cpu")
PENALTIES = Group("penalties", Moment.WORKER_AFTER, "schedulers", "always", predicate="seam.hooks:always")
ADAPTIVE_METRICS = Group("adaptive metrics", Moment.WORKER_AFTER, "schedulers", "`--speculative-adaptive`",
                         predicate="step.worker:adaptive_width")
CPU_ATTENTION = Group("cpu attention", Moment.SCHEDULER_START, "model-running processes",
                      "`--device cpu`, unless SGLANG_DOMINO_DEBUG=upstream-cpu-attention",
                      predicate="cpu.attention:wanted")
CPU_FORWARD = Group("cpu compiled forward", Moment.SCHEDULER_START, "model-running processes",
                    "`--device cpu` with `--enable-torch-compile`", predicate="cpu.compiled.switches:compiled_step",
                    prepare="cpu.compiled.switches:prepare")

# hybrid replay (issue 21): rows in the `hybrid replay` block of PATCHES
HYBRID_REPLAY = Group("hybrid replay", Moment.SCHEDULER_START, "schedulers",
                      "DFLASH with `--enable-linear-replayssm-spec`", predicate="serving.hybrid_replay:enabled",
                      prepare="serving.hybrid_replay:prepare")

# effective max_running_requests (issue 21): rows in the `running requests` block of PATCHES
RUNNING_REQUESTS = Group("running requests", Moment.SCHEDULER_START, "schedulers", "plugin enabled",
                         predicate="seam.scheduler_start:a_server")

# process-wide torch settings of the CPU port, set where their code runs (rows of `PATCHES`)
CPU_PROCESS = Group("cpu process settings", Moment.SCHEDULER_START, "model-running processes",
                    "as stated per row (done by the code the row names)")

GROUPS = (EVERY_PROCESS, CPU_ENGINE, CPU_MODELS, CPU_STANDIN, CHECKPOINT_COMPAT, CPU_DFLASH, DOMINO_ROLLOUT,
          B8_RESERVATION,
          WORKER, STEP, RESOLVE, PLATFORM, DISAGGREGATION, CPU_DISAGGREGATION, B8_STATE, CPU_ATTENTION, CPU_FORWARD,
          ADAPTIVE_METRICS, PENALTIES,
          HYBRID_REPLAY, RUNNING_REQUESTS, CPU_PROCESS)


@dataclass(frozen=True)
class Patch:
    name: str
    target: str   # upstream symbol; `Class.attr` of an instance attribute; a resolution step's name
    impl: str     # `module:attr` under sglang_domino.sglang
    kind: Kind
    group: Group
    why: str
    # parameters of the target the implementation passes or reads by name
    params: tuple[str, ...] = ()
    # INSTANCE / STEP_STATE rows: attributes the upstream class sets on its instances
    # (checked in its source), not class attributes
    attributes: tuple[str, ...] = ()

    @property
    def moment(self) -> Moment:
        return self.group.moment

    def implementation(self):
        return resolve(self.impl)


@dataclass(frozen=True)
class Dependency:
    """An upstream symbol the plugin relies on without changing it."""
    target: str
    why: str
    params: tuple[str, ...] = ()   # parameters the plugin passes or reads by name
    attributes: tuple[str, ...] = ()


_S = "sglang.srt"
_W2 = f"{_S}.speculative.dflash_worker_v2"


def groups_table(patches) -> str:
    """Every install group as a markdown table, in the order of its moment: where it is
    installed, in which processes, under which condition, by what, and how many rows it holds.
    UPSTREAM.md and docs/architecture.md show it verbatim (tests/sglang/test_seam.py)."""
    order = list(Moment)
    counts = {g.name: sum(1 for p in patches if p.group is g) for g in GROUPS}
    rows = ["| moment | group | processes | condition | installed by | rows |", "|---|---|---|---|---|---|"]
    for g in sorted(GROUPS, key=lambda g: order.index(g.moment)):
        if g.predicate:
            by = f"`install_moment`, predicate `{g.predicate}`" + (f", prepared by `{g.prepare}`" if g.prepare else "")
        elif g.moment in (Moment.WORKER_BEFORE, Moment.WORKER_AFTER, Moment.STEP):
            by = "the worker (`step/worker.py`)"
        else:
            by = "the code its rows name"
        rows.append(f"| {g.moment.value} | {g.name} | {g.processes} | {g.when.replace('|', chr(92) + '|')} | {by} "
                    f"| {counts[g.name]} |")
    return "\n".join(rows)
