"""Tools a policy may call while it generates: the protocol, the built-ins, users' own, the
runner that executes calls in worker processes, and the markup that carries calls and
results in the text.

A tool is a name, a deadline and a function from the call's text to a result string
(`Tool`). A call that fails is not an exception in the caller but a `ToolResult` whose
`cause` says why (`CAUSES`) and whose `text` is a one-line reason the model reads instead of
a result. Built-ins:

- `calculator`: exact arithmetic on integers and rationals (rlscale.rlvr.calculator); no code
  is evaluated.
- `python`: the call's text runs as a script in a sandbox (rlscale.runtime.sandbox): a fresh
  process tree in new Linux namespaces with a wall deadline, CPU, memory, output and
  process caps, a seccomp filter, no network, no keys and nothing of the machine to see but
  the system's read-only directories (where namespaces are unavailable the tool refuses to
  start unless `isolation: rlimits` is set by name). What it prints is the result; a final
  expression's value is printed too.

Users' own: `package.module:function`, called as `function(text) -> str` (raise
`ToolFailure` for a failed call with a reason of your own), or `package.module:object` for
an object that already has `name`, `deadline_s` and `__call__`.

Every call runs in a `WorkPool` worker (a fresh interpreter, replaced if a call kills it),
so no tool can hang or crash the process that generates. In the text, a call is
`<c>47+385</c>` and its result `<r>432</r>` by default: short tags in the printable alphabet
of the reasoning task (whose answer tag is `<a>`). With several tools the call tags name the
tool: `call_open: "<{name}>"`, `call_close: "</{name}>"`.
"""

from __future__ import annotations

import functools
import json
import pickle
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args, runtime_checkable

from pydantic import Field, model_validator

from ..config import StrictModel
from ..runtime import sandbox
from ..runtime.dotted import import_object
from ..runtime.workpool import Crash, Error, Ok, Outcome, Timeout, WorkPool, one_line
from .calculator import CalculatorError, calculate

Cause = Literal["ok", "error", "exit", "timeout", "memory", "output_limit", "crashed",
                "unknown_tool"]
CAUSES: tuple[str, ...] = get_args(Cause)
BUILTIN_TOOLS = ("calculator", "python")
NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"  # a tool name, as it may appear inside a tag
# The pool kills a call this long after its tool's deadline: a tool that keeps its own
# deadline (python) reports first, with its processes already cleaned up.
POOL_GRACE_S = 1.0


class ToolConfigError(ValueError):
    """A tools setting that cannot work (one line)."""


class ToolFailure(Exception):
    """Raised by a tool for a failed call: a one-line `reason` (the model reads it) and a
    `cause` from CAUSES."""

    def __init__(self, reason: str, cause: Cause = "error"):
        super().__init__(reason)
        self.reason = " ".join(reason.split())
        self.cause = cause


@runtime_checkable
class Tool(Protocol):
    name: str
    deadline_s: float

    def __call__(self, text: str) -> str: ...


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str | None  # None: the markup names no tool, so it is the only one configured
    text: str
    start: int = 0    # where its open tag starts in the generated text
    end: int = 0      # just after its close tag


@dataclass(frozen=True, slots=True)
class ToolResult:
    tool: str
    text: str         # the result, or why the call failed (one line)
    cause: Cause
    seconds: float

    @property
    def ok(self) -> bool:
        return self.cause == "ok"


# ------------------------------------------------------------------------------ built-ins

@dataclass(frozen=True)
class Calculator:
    deadline_s: float = 1.0
    name: str = "calculator"

    def __call__(self, text: str) -> str:
        try:
            return calculate(text)
        except CalculatorError as exc:
            raise ToolFailure(str(exc)) from None


@dataclass(frozen=True)
class PythonTool:
    limits: sandbox.SandboxLimits
    name: str = "python"

    @property
    def deadline_s(self) -> float:
        return self.limits.deadline_s

    def __call__(self, text: str) -> str:
        run = sandbox.run_python(text, self.limits)
        if not run.ok:
            raise ToolFailure(sandbox.describe(run, self.limits), run.cause)
        return run.output.rstrip()


@dataclass(frozen=True)
class FunctionTool:
    """A user's `function(text) -> str` as a tool."""

    name: str
    fn: Callable[[str], str]
    deadline_s: float

    def __call__(self, text: str) -> str:
        return self.fn(text)


# ----------------------------------------------------------------------------------- config

class ToolMarkup(StrictModel):
    """How a call and its result are written in the text. `{name}` in a call tag stands for
    the tool's name (needed when several tools are configured)."""

    call_open: str = Field("<c>", description="opens a call; may contain {name}")
    call_close: str = Field("</c>", description="closes a call: generation stops here and "
                            "the tool runs; may contain {name}")
    result_open: str = Field("<r>", description="opens the result appended after a call")
    result_close: str = Field("</r>", description="closes the result; generation resumes")
    format: Literal["tags", "chat_template"] = Field(
        "tags", description="tags: the call's text between the call tags, the result between "
        "the result tags; chat_template: a chat model's own format: the call is JSON "
        '{"name": ..., "arguments": {...}} between the call tags (e.g. <tool_call>), the '
        "result a tool message rendered by the tokenizer's chat template")

    @model_validator(mode="after")
    def _check(self) -> ToolMarkup:
        tags = {"call_open": self.call_open, "call_close": self.call_close,
                "result_open": self.result_open, "result_close": self.result_close}
        for key, tag in tags.items():
            if not tag.strip():
                raise ValueError(f"markup {key} must not be empty")
            if "{name}" in tag and key.startswith("result"):
                raise ValueError(f"markup {key} '{tag}' may not contain {{name}}")
        if "{name}" in self.call_close and "{name}" not in self.call_open:
            raise ValueError("markup call_close has {name} but call_open does not")
        if len(set(tags.values())) != 4:
            raise ValueError(f"markup tags must differ from each other, got {list(tags.values())}")
        if self.format == "chat_template" and "{name}" in self.call_open + self.call_close:
            raise ValueError("markup format chat_template names the tool in the call's JSON: "
                             "the call tags may not contain {name}")
        return self

    @property
    def names_tool(self) -> bool:
        """Whether a call says which tool it is for (in its tags, or in its JSON)."""
        return "{name}" in self.call_open or self.format == "chat_template"


class ToolsConfig(StrictModel):
    """`rollout.tools`: what a policy may call while it generates, and the limits of a call."""

    tools: list[str] = Field(default_factory=list, description="calculator, python, or "
                             "your own as package.module:function (text -> str)")
    max_tool_calls: int = Field(4, ge=0, description="calls per rollout; past it a call "
                                "is not run")
    deadline_s: float = Field(2.0, gt=0, le=600, description="wall time of one call")
    memory_mb: int = Field(512, ge=128, description="address space of a tool's worker and "
                           "of each process of the python sandbox; a python call holds at most "
                           "memory_mb + its 64 MB /work in all (a cgroup, where one can be made)")
    max_output_chars: int = Field(1000, ge=1, description="a longer result fails the call "
                                  "(python: bytes of output, read no further)")
    max_processes: int = Field(16, ge=3, description="python: processes of one call, its "
                               "sandbox's own two included")
    isolation: Literal["auto", "namespaces", "rlimits"] = Field(
        "auto", description="python: namespaces (no network, nothing of the machine visible), "
        "rlimits (limits, seccomp and an unprivileged uid, the machine's files in reach; for "
        "trusted code), or auto (namespaces, and a one-line refusal where they are unavailable)")
    workers: int = Field(1, ge=1, description="processes running calls in parallel")
    reproducible: bool = Field(
        False, description="wait for every call in flight before the next decode step: the "
        "same seed gives the same rollouts (a resumed run the unbroken one's) whatever the "
        "calls' timing, while decoding stalls on the slowest call; false: a call's row "
        "resumes whenever its result is back, and the other rows decode meanwhile")
    markup: ToolMarkup = Field(default_factory=ToolMarkup)

    @model_validator(mode="after")
    def _check(self) -> ToolsConfig:
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools are listed twice: {self.tools}")
        if len(self.tools) > 1 and not self.markup.names_tool:
            raise ValueError(f"{len(self.tools)} tools need call tags that name the tool, "
                             "e.g. markup.call_open '<{name}>' and call_close '</{name}>'")
        return self


# --------------------------------------------------------------------------------- registry

def resolve_isolation(requested: str) -> sandbox.Isolation:
    """The python sandbox's isolation. `auto` is namespaces, and never falls back: where they
    are unavailable the tool refuses to start, naming `isolation: rlimits` and what it leaves
    in reach; `rlimits` runs only when asked for by name, and only where it works."""
    if requested == "rlimits":
        problem = sandbox.probe("rlimits")
        if problem is not None:
            raise ToolConfigError(f"python tool: isolation 'rlimits' cannot run code here "
                                  f"({problem}); it runs the code as an unprivileged user "
                                  "(nobody under root), who must be able to read the Python "
                                  "installation")
        return "rlimits"
    problem = sandbox.probe()
    if problem is None:
        return "namespaces"
    if requested == "namespaces":
        raise ToolConfigError(f"python tool: isolation 'namespaces' is unavailable here "
                              f"({problem}); isolation: rlimits runs code without it")
    raise ToolConfigError(f"python tool: Linux namespaces are unavailable here ({problem}), so "
                          "model-written code cannot be contained; set isolation: rlimits to "
                          "run it under limits only (the machine's readable files and its "
                          "local sockets stay in reach: for trusted code)")


def user_tool(path: str, deadline_s: float) -> Tool:
    """`package.module:function` (or a Tool object) as a tool; one-line errors."""
    obj = import_object(path, what="tool")
    if isinstance(obj, Tool) and not isinstance(obj, type):
        tool = obj
    elif callable(obj):
        tool = FunctionTool(path.rpartition(":")[2].rpartition(".")[2], obj, deadline_s)
    else:
        raise ToolConfigError(f"tool '{path}' is a {type(obj).__name__}, not callable")
    try:
        pickle.dumps(tool)
    except Exception as exc:
        raise ToolConfigError(f"tool '{path}' must be picklable to run in tool workers "
                              f"(defined at module level): {one_line(exc)}") from None
    return tool


def resolve_tools(config: ToolsConfig) -> tuple[Tool, ...]:
    tools: list[Tool] = []
    for spec in config.tools:
        if spec == "calculator":
            tools.append(Calculator(config.deadline_s))
        elif spec == "python":
            tools.append(PythonTool(sandbox.SandboxLimits(
                deadline_s=config.deadline_s, memory_mb=config.memory_mb,
                max_output_bytes=config.max_output_chars, max_processes=config.max_processes,
                isolation=resolve_isolation(config.isolation))))
        elif ":" in spec:
            tools.append(user_tool(spec, config.deadline_s))
        else:
            raise ToolConfigError(f"unknown tool '{spec}' (built-in: {', '.join(BUILTIN_TOOLS)}; "
                                  "or your own as package.module:function)")
    names = [tool.name for tool in tools]
    for name in names:
        if not re.fullmatch(NAME, name):
            raise ToolConfigError(f"tool name '{name}' must match {NAME}")
    if len(set(names)) != len(names):
        raise ToolConfigError(f"tool names must differ, got {names}")
    return tuple(tools)


# ----------------------------------------------------------------------------------- runner

def call_tool(tool: Tool, text: str, max_output_chars: int) -> ToolResult:
    """One call, in a worker: whatever the tool does comes back as a ToolResult."""
    start = time.monotonic()
    try:
        output = tool(text)
        if not isinstance(output, str):
            raise TypeError(f"tool '{tool.name}' returned a {type(output).__name__}, not str")
        if len(output) > max_output_chars:
            raise ToolFailure(f"output over {max_output_chars} characters", "output_limit")
        return ToolResult(tool.name, output, "ok", time.monotonic() - start)
    except ToolFailure as failure:
        return ToolResult(tool.name, failure.reason[:max_output_chars], failure.cause,
                          time.monotonic() - start)
    except MemoryError as exc:
        return ToolResult(tool.name, one_line(exc), "memory", time.monotonic() - start)
    except Exception as exc:
        return ToolResult(tool.name, one_line(exc), "error", time.monotonic() - start)


def outcome_result(tool: Tool, outcome: Outcome, seconds: float) -> ToolResult:
    """A worker-pool outcome as a ToolResult: a killed or dead worker is a failed call."""
    match outcome:
        case Ok(result):
            return result
        case Timeout():
            return ToolResult(tool.name, f"timed out after {tool.deadline_s:g}s", "timeout",
                              seconds)
        case Crash():
            return ToolResult(tool.name, f"crashed: {outcome.describe()}", "crashed", seconds)
        case Error(message):
            cause = "memory" if message.startswith("MemoryError") else "error"
            return ToolResult(tool.name, message, cause, seconds)
    raise TypeError(f"not a worker-pool outcome: {outcome!r}")


@dataclass(frozen=True)
class ToolStats:
    calls: int = 0
    seconds: float = 0.0
    causes: Counter = field(default_factory=Counter)  # cause -> calls
    tools: Counter = field(default_factory=Counter)   # tool -> calls

    @classmethod
    def of(cls, results: Sequence[ToolResult]) -> ToolStats:
        return cls(len(results), sum(r.seconds for r in results), Counter(r.cause for r in results),
                   Counter(r.tool for r in results))

    def __add__(self, other: ToolStats) -> ToolStats:
        return ToolStats(self.calls + other.calls, self.seconds + other.seconds,
                         self.causes + other.causes, self.tools + other.tools)

    def as_metrics(self) -> dict[str, float]:
        """`tools/calls`, `tools/seconds_mean`, `tools/failed`, and one count per cause."""
        failed = self.calls - self.causes["ok"]
        return {"tools/calls": float(self.calls), "tools/failed": float(failed),
                "tools/seconds_mean": self.seconds / self.calls if self.calls else 0.0,
                **{f"tools/{cause}": float(self.causes[cause]) for cause in CAUSES if cause != "ok"}}


def _module_of(tool: Tool) -> str:
    """The module a worker imports to run `tool` (a user function's own, for FunctionTool)."""
    owner = tool.fn if isinstance(tool, FunctionTool) else type(tool)
    return getattr(owner, "__module__", None) or __name__


class ToolRunner:
    """Runs calls in `workers` persistent processes, each call under its tool's deadline,
    and counts them by cause (`stats`).

    Each worker is a pool of its own, checked out for one call at a time: calls from
    concurrent `run`s (an engine's parked requests, one thread each) and the calls of one
    batch alike spread over every worker, and a slow call holds up only its own worker.
    `run` is thread-safe; close the runner at the end (or use `with`); workers are stopped
    at interpreter exit in any case."""

    def __init__(self, tools: Sequence[Tool], *, workers: int = 1, memory_mb: int = 512,
                 max_output_chars: int = 1000):
        self.tools = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            raise ToolConfigError(f"tool names must differ, got {[t.name for t in tools]}")
        self.max_output_chars = max_output_chars
        self.stats = ToolStats()
        self._stats_lock = threading.Lock()
        self._pools: list[WorkPool] = []
        self._idle: queue.SimpleQueue[WorkPool] = queue.SimpleQueue()
        preload = sorted({__name__} | {_module_of(tool) for tool in tools})
        try:
            for _ in range(workers):
                self._pools.append(WorkPool(1, timeout_s=None, memory_mb=memory_mb,
                                            preload=preload))
                self._idle.put(self._pools[-1])
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, config: ToolsConfig) -> ToolRunner:
        return cls(resolve_tools(config), workers=config.workers, memory_mb=config.memory_mb,
                   max_output_chars=config.max_output_chars)

    @property
    def pids(self) -> list[int]:
        return [pid for pool in self._pools for pid in pool.pids]

    def tool(self, name: str | None) -> Tool | None:
        if name is None:
            return next(iter(self.tools.values())) if len(self.tools) == 1 else None
        return self.tools.get(name)

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order."""
        if len(calls) <= 1:
            results = [self._run_one(call) for call in calls]
        else:
            with ThreadPoolExecutor(min(len(calls), len(self._pools))) as threads:
                results = list(threads.map(self._run_one, calls))
        with self._stats_lock:
            self.stats = self.stats + ToolStats.of(results)
        return results

    def _run_one(self, call: ToolCall) -> ToolResult:
        tool = self.tool(call.name)
        if tool is None:
            return ToolResult(str(call.name), f"unknown tool '{call.name}' (known: "
                              f"{', '.join(self.tools)})", "unknown_tool", 0.0)
        pool = self._idle.get()
        try:
            start = time.monotonic()
            outcome, = pool.map(functools.partial(call_tool, max_output_chars=self.max_output_chars),
                                [(tool, call.text)], timeout_s=tool.deadline_s + POOL_GRACE_S)
            return outcome_result(tool, outcome, time.monotonic() - start)
        finally:
            self._idle.put(pool)

    def close(self) -> None:
        for pool in self._pools:
            pool.close()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ----------------------------------------------------------------------------------- markup

def _tag_pattern(tag: str, names: Collection[str] | None, capture: bool = True) -> str:
    name = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) \
        if names is not None else NAME
    group = f"(?P<name>{name})" if capture else f"(?:{name})"
    return "".join(group if part == "{name}" else re.escape(part)
                   for part in re.split(r"(\{name\})", tag))


@functools.lru_cache(maxsize=64)
def _call_patterns(markup: tuple[str, str], names: tuple[str, ...] | None
                   ) -> tuple[re.Pattern, re.Pattern]:
    call_open, call_close = markup
    return (re.compile(_tag_pattern(call_open, names)),
            re.compile(rf"(?P<close>{_tag_pattern(call_close, names)})\s*\Z"))


def parse_call(text: str, markup: ToolMarkup, names: Collection[str] | None = None
               ) -> ToolCall | None:
    """The call that ends `text` (its close tag, then whitespace at most), else None. The
    call's text runs from the last open tag before the close tag. With `{name}` in the tags,
    `names` (the configured tools) keeps other tags, such as an answer tag `<a>`, from
    reading as calls."""
    key = tuple(sorted(names)) if names is not None else None
    open_pattern, close_pattern = _call_patterns((markup.call_open, markup.call_close), key)
    close = close_pattern.search(text)
    if close is None:
        return None
    opens = list(open_pattern.finditer(text, 0, close.start()))
    if not opens:
        return None
    opened = opens[-1]
    open_name = opened.groupdict().get("name")
    close_name = close.groupdict().get("name")
    if open_name is not None and close_name is not None and open_name != close_name:
        return None
    body = text[opened.end():close.start()]
    if markup.format == "chat_template":
        name, body = json_call(body)
        return ToolCall(name, body, opened.start(), close.end("close"))
    return ToolCall(open_name or close_name, body, opened.start(), close.end("close"))


def json_call(body: str) -> tuple[str | None, str]:
    """A chat model's call, `{"name": ..., "arguments": {...}}`: the tool's name and the text
    it is given (an argument's value when there is one, else the arguments as JSON). A body
    that is not such JSON gives no name (the call then fails as an unknown tool, or in the
    only tool's own parsing) and itself as the text."""
    try:
        call = json.loads(body)
    except ValueError:
        return None, body.strip()
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, body.strip()
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        return call["name"], arguments
    if isinstance(arguments, dict) and len(arguments) == 1:
        (value,) = arguments.values()
        return call["name"], value if isinstance(value, str) else json.dumps(value)
    return call["name"], json.dumps(arguments)


def chat_tool_turn(tokenizer, name: str, text: str) -> str:
    """What follows a chat model's call, as its own chat template writes it: the end of the
    assistant's turn, a `tool` message holding `text`, and the start of the assistant's next
    turn. Rendered as the difference between a conversation ending in the (unfinished)
    assistant turn and the same conversation with the tool message and a generation prompt."""
    user = {"role": "user", "content": "."}
    assistant = {"role": "assistant", "content": "."}
    before = tokenizer.apply_chat_template([user, assistant], tokenize=False,
                                           continue_final_message=True)
    after = tokenizer.apply_chat_template(
        [user, assistant, {"role": "tool", "name": name, "content": text}], tokenize=False,
        add_generation_prompt=True)
    if not after.startswith(before):
        raise ToolConfigError("the chat template does not render a tool message after the "
                              "assistant's turn (markup.format chat_template needs one that does)")
    return after[len(before):]


def close_tags(markup: ToolMarkup, names: Collection[str]) -> list[str]:
    """The strings that end a call: where generation stops for the tool to run."""
    if "{name}" not in markup.call_close:
        return [markup.call_close]
    return [markup.call_close.replace("{name}", name) for name in names]


def clean_result(text: str, markup: ToolMarkup) -> str:
    """`text` without any of the markup's tags, so that a result can neither end itself
    early nor open a call the model did not write."""
    tags = re.compile("|".join(_tag_pattern(tag, None, capture=False) for tag in (
        markup.call_open, markup.call_close, markup.result_open, markup.result_close)))
    while (cleaned := tags.sub("", text)) != text:  # "<<r>r>" leaves "<r>" after one pass
        text = cleaned
    return text


RESULT_SLOT = "\ue000rlscale-tool-result\ue000"  # where a template puts the content


def result_turn(text: str, markup: ToolMarkup, tokenizer=None, name: str = ""
                ) -> tuple[str, str, str]:
    """The text after a call as (before, content, after): the result's cleaned content apart
    from the markup or chat-template text around it, so that the content can be encoded as
    plain text (`encode_result_turn`) and the markup with the tokenizer's special tokens."""
    content = clean_result(text, markup)
    if markup.format != "chat_template":
        return markup.result_open, content, markup.result_close
    turn = chat_tool_turn(tokenizer, name, RESULT_SLOT)
    if turn.count(RESULT_SLOT) != 1:
        raise ToolConfigError("the chat template does not write a tool message's content "
                              "verbatim once (markup.format chat_template needs one that does)")
    before, _, after = turn.partition(RESULT_SLOT)
    return before, content, after


def encode_result_turn(tokenizer, parts: tuple[str, str, str]) -> list[int]:
    """Token ids of `result_turn`'s parts. The content is split like any text, special-token
    strings included: a result that prints `<|im_end|>` cannot end the tool's turn or forge a
    user's (the markup around it keeps its real special tokens)."""
    before, content, after = parts

    def ids(text: str, **kwargs) -> list[int]:
        return tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"] if text else []

    return ids(before) + ids(content, split_special_tokens=True) + ids(after)


def format_result(result: ToolResult | str, markup: ToolMarkup) -> str:
    """The text appended after a call (format tags): the cleaned result in the result tags."""
    text = result.text if isinstance(result, ToolResult) else result
    return "".join(result_turn(text, markup))
