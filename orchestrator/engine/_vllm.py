"""vLLM's own platform detection as the engine's platform step
(``engine="vllm"``, ``run --engine vllm``).

The plugins are vLLM's: every entry of
``vllm.platforms.builtin_platform_plugins`` and every ``vllm.platform_plugins``
entry point that ``VLLM_PLUGINS`` allows, in vLLM's order, resolved by
vLLM's rules (the platform step's: out-of-tree wins, two of a kind
conflict); ``VLLM_TARGET_DEVICE=cpu`` probes vLLM's cpu plugin alone, as
``resolve_current_platform_cls_qualname`` does. Each plugin
``platform/<name>`` runs two recorded children:

* ``register`` — the plugin's own function (an entry point is loaded here,
  so a plugin that cannot even be imported fails as itself). What vLLM's
  loggers write meanwhile is kept in its result (``records``; in the notes
  of its exception when it raises): vLLM's plugins swallow their own
  errors and say why only in DEBUG lines, so a decline's reason is taken
  from them (``... not available because: NVML Shared Library Not Found``).
  The loggers are process-wide and the plugins run concurrently, so one
  capture is held for the whole platform step and each record is credited
  to the plugin whose thread wrote it (a context variable).
* ``load_class`` — importing the class it named, through the run's
  importer: where plugins in the style of vllm-ascend or vllm-gaudi really
  fail. vLLM imports only the winner's class; a winner whose class does not
  import fails the step with that error, as it fails vLLM.

The decision is handed back: in this process vLLM's current platform is set
to an instance of the selected class (``vllm.platforms._current_platform``,
which vLLM reads lazily), so vLLM does not detect again. Tested with vLLM
0.33 (:data:`TESTED_RELEASES`); another release runs too, with a WARNING.
vLLM is imported only when the platform step runs.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from events import JsonValue, Redactor

from .._context import StepBody, StepContext, StepResult, Unavailable
from .._policy import ANY_EXCEPTION_POLICY
from .._vllm_releases import TESTED_RELEASES, installed_vllm_version, is_tested
from ._config import CPU_TARGET_HINT, EngineConfig, EngineConfigError
from ._host import TARGET_DEVICE_VARIABLE
from ._platform import (
    PluginSpec,
    _entry_points,
    _given,
    check_plugin_name,
    decline,
)
from ._resolution import PluginOutcome

__all__ = ["INSTALL_COMMAND", "VLLM_PLUGIN_GROUP", "VllmPlugins", "vllm_version"]

#: How to install vLLM's platform code without its CUDA dependencies.
INSTALL_COMMAND = "pip install --no-deps vllm==0.33.0 && pip install packaging regex psutil"

#: The entry-point group of vLLM's out-of-tree platform plugins.
VLLM_PLUGIN_GROUP = "vllm.platform_plugins"

#: Records kept per platform step, and characters per record, so a plugin
#: that logs without end cannot grow its events without bound.
_MAX_RECORDS = 256
_MAX_MESSAGE = 2048

#: The plugin a vLLM log record is credited to (``None``: no plugin's, not kept).
_PLUGIN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "startup_orchestrator_vllm_plugin", default=None
)


def vllm_version() -> str:
    """The installed vLLM's version, read from its distribution without
    importing it.

    Raises:
        EngineConfigError: vLLM is not installed (the message says how to
            install it).
    """
    if importlib.util.find_spec("vllm") is None:
        raise EngineConfigError(
            "engine",
            "vllm",
            f"vLLM is not installed; install its platform code with: "
            f"{INSTALL_COMMAND} (vLLM's own dependencies pull a CUDA build of torch)",
        )
    return installed_vllm_version()


class _Capture(logging.Handler):
    """Keeps what vLLM's loggers write while the plugins run, by plugin,
    and passes on to the handlers vLLM's logger had whatever they would
    have received anyway."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logging.DEBUG)
        self.records: dict[str, list[dict[str, JsonValue]]] = {}
        self.kept = 0
        self._threshold = logger.getEffectiveLevel()
        self._handlers = list(logger.handlers)
        self._parent = logger.parent if logger.propagate else None
        self._redact = Redactor.from_environment()

    def emit(self, record: logging.LogRecord) -> None:
        plugin = _PLUGIN.get()
        # Only a plugin's own records are kept: the engine's other threads
        # log on meanwhile (vLLM's main thread, beside a recording's
        # platform step), and theirs would use the budget up.
        if plugin is not None and self.kept < _MAX_RECORDS:
            self.kept += 1
            entry: dict[str, JsonValue] = {
                "logger": record.name,
                "level": record.levelname,
                "message": self._redact(record.getMessage())[:_MAX_MESSAGE],
            }
            if record.exc_info and record.exc_info[1] is not None:
                error = record.exc_info[1]
                entry["exception"] = self._redact(f"{type(error).__name__}: {error}")[:_MAX_MESSAGE]
            self.records.setdefault(plugin, []).append(entry)
        if record.levelno >= self._threshold:
            for handler in self._handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            if self._parent is not None:
                self._parent.callHandlers(record)


def _reason(records: list[JsonValue]) -> str | None:
    """What vLLM said a plugin declined for: the text after ``because`` in
    the last record that has one (``CUDA platform is not available
    because: NVML Shared Library Not Found``)."""
    for record in reversed(records):
        message = str(record.get("message", "")) if isinstance(record, dict) else ""
        _, because, why = message.partition(" because")
        if because and why.strip(" :."):
            return why.strip(" :").removesuffix(".")
    return None


class VllmPlugins:
    """vLLM's platform plugins, for :func:`~orchestrator.engine.make_platform_step`.

    Args:
        config: the engine configuration (step timeout, target device).
        discover: whether to look up vLLM's out-of-tree plugins.
        modelled: the graph's steps that are the reference engine's model
            rather than vLLM's code (recorded, and said in the report).

    Raises:
        EngineConfigError: vLLM is not installed.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        discover: bool = True,
        modelled: Sequence[str] = ("attention", "flashinfer_comm", "allreduce_workspace"),
    ) -> None:
        self.config = config
        self.discover = discover
        self.version = vllm_version()
        self.attributes: Mapping[str, JsonValue] = {
            "engine": "vllm",
            "vllm_version": self.version,
            "vllm_tested": ", ".join(TESTED_RELEASES),
            "vllm_supported": is_tested(self.version),
            "modelled": list(modelled),
        }
        self._capture: _Capture | None = None
        # Each plugin's class, or what importing it raised.
        self._loaded: dict[str, Any] = {}

    @contextlib.contextmanager
    def session(self) -> Iterator[object]:
        # vLLM's records at DEBUG while the plugins run; the logger's level,
        # handlers and propagation are put back afterwards.
        logger = logging.getLogger("vllm")
        level, handlers, propagate = logger.level, logger.handlers, logger.propagate
        self._capture = capture = _Capture(logger)
        logger.handlers = [capture]
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        try:
            yield capture
        finally:
            self._capture = None
            logger.setLevel(level)
            logger.handlers, logger.propagate = handlers, propagate

    async def specs(self, ctx: StepContext) -> list[PluginSpec]:
        if self.config.target_device is not None:
            # As VLLM_TARGET_DEVICE: vLLM reads it from the environment, in
            # this process and in the processes it starts.
            os.environ[TARGET_DEVICE_VARIABLE] = self.config.target_device
        platforms: Any = await ctx.to_thread(ctx.import_module, "vllm.platforms")
        envs: Any = ctx.import_module("vllm.envs")
        specs = [
            PluginSpec(name=name, builtin=True, priority=index, body=self._body(name, _given(func)))
            for index, (name, func) in enumerate(platforms.builtin_platform_plugins.items())
        ]
        if envs.VLLM_TARGET_DEVICE == "cpu":
            # resolve_current_platform_cls_qualname's fast path.
            return [spec for spec in specs if spec.name == "cpu"]
        if not self.discover:
            return specs
        allowed = envs.VLLM_PLUGINS
        seen: set[str] = set()
        for entry_point in await ctx.to_thread(_entry_points, VLLM_PLUGIN_GROUP):
            if allowed is not None and entry_point.name not in allowed:
                continue
            check_plugin_name(entry_point.name, seen, f"entry point {entry_point.value}")
            seen.add(entry_point.name)
            specs.append(
                PluginSpec(
                    name=entry_point.name,
                    builtin=False,
                    priority=len(specs),
                    body=self._body(entry_point.name, entry_point.load),
                    attributes={"entry_point": entry_point.value},
                )
            )
        return specs

    def _body(self, name: str, load: Callable[[], object]) -> StepBody:
        async def register(ctx: StepContext) -> JsonValue:
            token = _PLUGIN.set(name)
            try:
                func = await ctx.to_thread(load)
                if not callable(func):
                    raise TypeError(f"platform plugin {name!r} loaded {func!r}, not a function")
                value = await ctx.to_thread(func)
            except Exception as exc:
                for record in self._records(name):
                    exc.add_note(f"vLLM logged: {record['level']} {record['message']}")
                raise
            finally:
                _PLUGIN.reset(token)
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"platform plugin {name!r} returned {type(value).__name__}; vLLM's plugins "
                    "return the qualified name of a platform class or None"
                )
            return {"returned": value, "records": list(self._records(name))}

        async def probe(ctx: StepContext) -> JsonValue | Unavailable:
            # What register() raises propagates to this plugin, which
            # records it (a failed plugin); importing the class it named is
            # recorded and matters only if this plugin wins.
            answer: Any = (await ctx.run_child("register", register)).value
            qualname = answer.get("returned") if isinstance(answer, dict) else None
            if not isinstance(qualname, str):
                return decline(self._decline_reason(name, answer))
            module, _, attribute = qualname.rpartition(".")

            def load_class(child: StepContext) -> JsonValue:
                try:
                    cls = getattr(child.import_module(module), attribute)
                except Exception as exc:
                    self._loaded[name] = exc
                    raise
                self._loaded[name] = cls
                device = getattr(cls, "device_type", None)
                return {"qualname": qualname, "device": device if isinstance(device, str) else None}

            loaded = await ctx.run_child("load_class", load_class, policy=ANY_EXCEPTION_POLICY)
            device = loaded.value.get("device") if isinstance(loaded.value, dict) else None
            return {
                "activated": True,
                "platform_class": attribute,
                "qualname": qualname,
                "device": device,
                "loaded": loaded.ok,
            }

        return probe

    def _records(self, name: str) -> list[dict[str, JsonValue]]:
        return [] if self._capture is None else self._capture.records.pop(name, [])

    def _decline_reason(self, name: str, answer: JsonValue) -> str:
        records = answer.get("records") if isinstance(answer, dict) else None
        said = _reason(records) if isinstance(records, list) else None
        if said is not None:
            return said
        # vLLM's cpu and xpu plugins decline without a word.
        if name == "cpu":
            target = os.environ.get(TARGET_DEVICE_VARIABLE, "cuda").lower()
            return (
                f"vLLM {self.version} is not a CPU build and {TARGET_DEVICE_VARIABLE} is "
                f"{target!r} ({CPU_TARGET_HINT})"
            )
        if name == "xpu":
            return "torch.xpu is not available"
        return f"platform plugin {name!r} returned None and logged no reason"

    async def adopt(
        self, ctx: StepContext, selected: PluginOutcome, results: Mapping[str, StepResult]
    ) -> Mapping[str, JsonValue]:
        cls: Any = self._loaded.get(selected.plugin)
        if isinstance(cls, BaseException):
            # vLLM imports the winner's class and fails the same way.
            raise cls
        value = results[selected.plugin].value
        qualname = value.get("qualname") if isinstance(value, dict) else None
        platforms: Any = ctx.import_module("vllm.platforms")
        handed_back = platforms._current_platform is None and cls is not None
        if handed_back:
            platforms._current_platform = await ctx.to_thread(cls)
        return {"qualname": qualname, "handed_back": handed_back}
