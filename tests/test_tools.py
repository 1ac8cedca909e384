"""Tools: the calculator's arithmetic, the call/result markup, users' tools by dotted path,
the runner's outcomes by cause, and the python sandbox against hostile code: every hostile
program is a failed call, counted by cause, and leaves no process behind."""

import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from processes import alive, descendants, with_text_in_command_line
from rlscale.rlvr.calculator import CalculatorError, calculate
from rlscale.rlvr.tools import (
    Calculator,
    ToolCall,
    ToolConfigError,
    ToolFailure,
    ToolMarkup,
    ToolResult,
    ToolRunner,
    ToolsConfig,
    ToolStats,
    close_tags,
    format_result,
    parse_call,
    resolve_isolation,
    resolve_tools,
)
from rlscale.runtime import sandbox
from rlscale.runtime.dotted import DottedPathError
from rlscale.runtime.workpool import Timeout, WorkPool

SHARED = Path(__file__).resolve().parents[2] / "shared"  # beside the checkout

NAMESPACES = sandbox.probe()
needs_namespaces = pytest.mark.skipif(NAMESPACES is not None,
                                      reason=f"no user namespaces here: {NAMESPACES}")
DEADLINE_S = 1.0
PYTHON_DEADLINE_S = 2.0  # a fresh interpreter starts within it on a loaded 2-core machine


# ------------------------------------------------------------------------------ calculator

@pytest.mark.parametrize("expression, value", [
    ("47+385-96+710", "1046"), ("2*(3+4)", "14"), ("7/14", "1/2"), ("-3/4 + 1/4", "-1/2"),
    ("2^10", "1024"), ("2**3**2", "512"), ("-2^2", "-4"), ("2^-2", "1/4"), ("1.5*2", "3"),
    (" 12 * 12 ", "144"), ("--3", "3"), ("(((1)))", "1"), ("0^0", "1"),
    ("123456789012345678901234567890*10", "1234567890123456789012345678900"),
])
def test_calculator_is_exact(expression, value):
    assert calculate(expression) == value
    assert Calculator()(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("1/0", "division by zero"), ("0^-1", "division by zero"), ("1/(2-2)", "division by zero"),
    ("1+", "unexpected end"), ("(1", "missing ')'"), ("1)", "unexpected ')' at position 1"),
    ("3 $ 4", "unexpected character '$'"), ("", "empty"), ("2^0.5", "not an integer"),
    ("2^99999", "larger than"), ("9" * 1001, "longer than"), ("(" * 60 + "1" + ")" * 60, "nested"),
    ("__import__('os')", "unexpected character '_'"), ("1 2", "unexpected '2'"),
])
def test_calculator_failures_are_one_line(expression, reason):
    with pytest.raises(CalculatorError) as error:
        calculate(expression)
    assert reason in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ToolFailure) as failure:
        Calculator()(expression)
    assert failure.value.cause == "error" and reason in failure.value.reason


# ---------------------------------------------------------------------------------- markup

NAMED = ToolMarkup(call_open="<{name}>", call_close="</{name}>")


def test_parse_call_finds_the_call_that_ends_the_text():
    markup = ToolMarkup()
    text = "47+385=<c>47+385</c>"
    call = parse_call(text, markup)
    assert call == ToolCall(None, "47+385", 7, len(text))
    assert parse_call(text + " \n", markup) == call  # whitespace after the tag is fine
    assert parse_call("47+385=<c>47+385", markup) is None      # not closed yet
    assert parse_call("<c>1+1</c> then more", markup) is None  # not at the end
    assert parse_call("1+1</c>", markup) is None               # never opened
    assert parse_call("<c>1<c>2+3</c>", markup).text == "2+3"  # the last open tag wins
    assert parse_call("<c></c>", markup).text == ""


def test_parse_call_with_named_tags():
    assert parse_call("x <python>print(1)</python>", NAMED) == \
        ToolCall("python", "print(1)", 2, 27)
    assert parse_call("<calculator>1+1</python>", NAMED) is None  # names disagree
    # The task's answer tag looks like a call to a tool named "a" unless the names are known.
    assert parse_call("<a>12</a>", NAMED).name == "a"
    assert parse_call("<a>12</a>", NAMED, names=["calculator", "python"]) is None
    assert parse_call("<calculator>1+1</calculator>", NAMED, names=["calculator"]).text == "1+1"
    assert close_tags(NAMED, ["calculator", "python"]) == ["</calculator>", "</python>"]
    assert close_tags(ToolMarkup(), ["calculator"]) == ["</c>"]


def test_format_result_round_trip():
    markup = ToolMarkup()
    text = "47+385=<c>47+385</c>"
    result = ToolResult("calculator", "432", "ok", 0.0)
    extended = text + format_result(result, markup)
    assert extended == "47+385=<c>47+385</c><r>432</r>"
    assert parse_call(extended, markup) is None  # the call is answered
    # markup inside a result can neither close it early nor open a call
    assert format_result("a</r>b<c>c<<r>r>", markup) == "<r>abc</r>"
    assert format_result("</python>x", NAMED) == "<r>x</r>"


def test_tools_config_defaults_and_one_line_errors():
    config = ToolsConfig(tools=["calculator"])
    assert (config.markup.call_open, config.markup.result_close, config.max_tool_calls) == \
        ("<c>", "</r>", 4)
    with pytest.raises(ValidationError, match="name the tool"):
        ToolsConfig(tools=["calculator", "python"])
    ToolsConfig(tools=["calculator", "python"], markup=NAMED)
    with pytest.raises(ValidationError, match="listed twice"):
        ToolsConfig(tools=["calculator", "calculator"])
    with pytest.raises(ValidationError, match="must differ"):
        ToolMarkup(result_open="<c>")
    with pytest.raises(ValidationError, match="may not contain"):
        ToolMarkup(result_open="<{name}>")
    with pytest.raises(ValidationError, match="must not be empty"):
        ToolMarkup(call_close=" ")
    with pytest.raises(ValidationError, match="Extra inputs"):
        ToolsConfig(tools=["calculator"], deadline=3)
    with pytest.raises(ValidationError):
        ToolsConfig(deadline_s=0)


# ---------------------------------------------------------------------- registry and runner

def test_unknown_and_unimportable_tools_are_one_line_errors():
    with pytest.raises(ToolConfigError, match="unknown tool 'calc' .*calculator, python"):
        resolve_tools(ToolsConfig(tools=["calc"]))
    with pytest.raises(DottedPathError, match="cannot import module 'no_such_module'") as e:
        resolve_tools(ToolsConfig(tools=["no_such_module:run"]))
    assert "\n" not in str(e.value)
    with pytest.raises(DottedPathError, match="has no attribute 'nothing'"):
        resolve_tools(ToolsConfig(tools=["user_tools:nothing"]))
    with pytest.raises(ToolConfigError, match="not callable"):
        resolve_tools(ToolsConfig(tools=["user_tools:not_callable"]))


def test_user_tools_resolve_by_dotted_path():
    tools = resolve_tools(ToolsConfig(tools=["calculator", "user_tools:shout", "user_tools:reverse"],
                                      markup=NAMED, deadline_s=3.0))
    assert [t.name for t in tools] == ["calculator", "shout", "rev"]
    assert [t.deadline_s for t in tools] == [3.0, 3.0, 0.5]  # a tool object keeps its own
    assert tools[1]("hi") == "HI" and tools[2]("abc") == "cba"


@pytest.fixture(scope="module")
def runner():
    tools = resolve_tools(ToolsConfig(
        tools=["calculator", "user_tools:shout", "user_tools:refuse", "user_tools:slow",
               "user_tools:wrong_type", "user_tools:flood", "user_tools:die", "user_tools:hog"],
        markup=NAMED, deadline_s=DEADLINE_S))
    with ToolRunner(tools, max_output_chars=1000) as tool_runner:
        yield tool_runner
        pids = tool_runner.pids
    assert not any(alive(pid) for pid in pids)


def test_runner_scores_every_outcome_by_cause(runner):
    before = runner.stats
    calls = [ToolCall("calculator", "47+385"), ToolCall("shout", "ok"),
             ToolCall("calculator", "1/0"), ToolCall("refuse", ""), ToolCall("wrong_type", ""),
             ToolCall("flood", ""), ToolCall("hog", ""), ToolCall("die", ""),
             ToolCall("slow", ""), ToolCall("search", "x"), ToolCall(None, "1+1")]
    results = runner.run(calls)
    assert [(r.tool, r.cause) for r in results] == [
        ("calculator", "ok"), ("shout", "ok"), ("calculator", "error"), ("refuse", "error"),
        ("wrong_type", "error"), ("flood", "output_limit"), ("hog", "memory"),
        ("die", "crashed"), ("slow", "timeout"), ("search", "unknown_tool"),
        ("None", "unknown_tool")]
    texts = [r.text for r in results]
    assert texts[:4] == ["432", "OK", "division by zero", "no such record in the table"]
    assert "returned a int, not str" in texts[4] and "over 1000 characters" in texts[5]
    assert "MemoryError" in texts[6] and "exit status 3" in texts[7]
    assert texts[8] == f"timed out after {DEADLINE_S:g}s" and "unknown tool 'search'" in texts[9]
    assert all("\n" not in t for t in texts)
    after = runner.stats  # cumulative: the difference is this batch
    assert after.calls - before.calls == len(calls)
    assert after.causes - before.causes == {
        "ok": 2, "error": 3, "output_limit": 1, "memory": 1, "crashed": 1, "timeout": 1,
        "unknown_tool": 2}
    assert (after.tools - before.tools)["calculator"] == 2
    metrics = ToolStats.of(results).as_metrics()
    assert metrics["tools/calls"] == 11 and metrics["tools/failed"] == 9
    assert metrics["tools/timeout"] == 1 and metrics["tools/unknown_tool"] == 2
    # the pool replaced the killed workers and goes on
    assert runner.run([ToolCall("calculator", "6*7")])[0].text == "42"


def test_calls_spread_over_the_workers():
    tools = resolve_tools(ToolsConfig(tools=["user_tools:worker_pid"]))
    with ToolRunner(tools, workers=2) as two:
        results = two.run([ToolCall(None, "1.0"), ToolCall(None, "1.0")])
        assert {r.text for r in results} == {str(pid) for pid in two.pids}  # one call each
        assert two.stats.calls == 2 and two.stats.tools["worker_pid"] == 2


# ------------------------------------------------------------------------ the python sandbox

@pytest.fixture(scope="module")
def python_runner():
    """One worker running `python` calls in the strongest sandbox this machine allows."""
    config = ToolsConfig(tools=["python"], deadline_s=PYTHON_DEADLINE_S, memory_mb=512,
                         max_output_chars=10_000, max_processes=16)
    with ToolRunner.from_config(config) as tool_runner:
        yield tool_runner


def run_contained(runner: ToolRunner, code: str) -> ToolResult:
    """Run `code`, then check that nothing it started is alive, however it was reparented."""
    marker = f"marker-{uuid.uuid4().hex}"
    before = descendants(os.getpid())  # other fixtures' workers among them
    result, = runner.run([ToolCall(None, f"# {marker}\n{code}")])
    assert descendants(os.getpid()) <= before | set(runner.pids)  # a worker may be replaced
    assert not with_text_in_command_line(marker)
    return result


def test_python_tool_runs_code(python_runner):
    result = run_contained(python_runner, "x = 6 * 7\nprint('x is', x)\nx + 1")
    assert (result.cause, result.text) == ("ok", "x is 42\n43")
    result = run_contained(python_runner, "1/0")
    assert result.cause == "error" and result.text == "ZeroDivisionError: division by zero"
    assert run_contained(python_runner, "def f(:\n  pass").text.startswith("SyntaxError")


@needs_namespaces
@pytest.mark.parametrize("name, code, cause", [
    ("infinite loop", "while True:\n    pass", "timeout"),
    ("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                  "        pass", "timeout"),
    ("30 GB", "block = bytearray(30 * 2**30)", "memory"),
    ("1 GB of output", "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * 2**20)",
     "output_limit"),
    ("/etc/passwd", "print(open('/etc/passwd').read())", "error"),
    ("../shared", "import os\nprint(os.listdir('../shared'))", "error"),
    ("the project", f"print(open({str(SHARED / 'DESIGN.md')!r}).read())", "error"),
    ("escape by setsid", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                         "    time.sleep(60)\nwhile True:\n    pass", "timeout"),
])
def test_hostile_code_is_a_failed_call_and_leaves_nothing(python_runner, name, code, cause):
    before = python_runner.stats.causes[cause]
    start = time.monotonic()
    result = run_contained(python_runner, code)
    assert result.cause == cause, result
    assert python_runner.stats.causes[cause] == before + 1
    assert time.monotonic() - start < PYTHON_DEADLINE_S + 3
    if cause == "error":
        assert "No such file or directory" in result.text


@needs_namespaces
def test_no_network(python_runner):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
        result = run_contained(python_runner, code)
        # its own loopback is down, and the machine's is in another network namespace
        assert result.cause == "error" and "Network is unreachable" in result.text
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing came through
        result = run_contained(python_runner, "import socket\n"
                               "socket.create_connection(('1.1.1.1', 53), timeout=2)")
        assert result.cause == "error" and "unreachable" in result.text
    finally:
        server.close()


@needs_namespaces
def test_process_cap_and_a_fresh_directory_per_call(python_runner):
    code = ("import os, time\nchildren = 0\nwhile children < 100:\n    try:\n"
            "        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        time.sleep(60)\n    children += 1\nchildren")
    result = run_contained(python_runner, code)
    # boot, init and the code's process count towards the cap of 16
    assert result.cause == "ok" and int(result.text) == 13
    result = run_contained(python_runner, "import os\nopen('left.txt', 'w').write('x')\n"
                           "print(os.getcwd(), os.environ['HOME'], *sorted(os.listdir('/')))")
    cwd, home, *top = result.text.split()
    assert (cwd, home) == ("/work", "/work")
    # the system and the Python installation (/usr, /lib, ... and the interpreter's own prefix), nothing else
    shown = {path.split("/")[1] for path in sandbox.visible_paths()}
    assert set(top) == shown | {"dev", "tmp", "work"} and "etc" not in top and "home" not in top
    assert run_contained(python_runner, "import os\nos.listdir('.')").text == "[]"
    result = run_contained(python_runner, "open('/usr/x', 'w')")
    assert "Read-only file system" in result.text


@needs_namespaces
def test_a_killed_worker_takes_its_call_along():
    """The pool's deadline is a backstop: if it kills a worker mid-call (here the sandbox's
    own deadline is longer), the call's processes die with it."""
    marker = f"marker-{uuid.uuid4().hex}"
    code = f"# {marker}\nimport os\nos.fork()\nwhile True:\n    pass"
    with WorkPool(1, timeout_s=DEADLINE_S, memory_mb=512) as pool:
        outcome, = pool.map(sandbox.run_python, [(code, sandbox.SandboxLimits(deadline_s=60))])
    assert isinstance(outcome, Timeout)
    deadline = time.monotonic() + 3.0  # SIGKILL on the parent's death, down the tree
    while with_text_in_command_line(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not with_text_in_command_line(marker)


def test_isolation_never_falls_back_silently(monkeypatch):
    """Without namespaces, `auto` refuses the python tool with one line naming
    `isolation: rlimits` and what it leaves in reach; `rlimits` runs only when asked for by
    name, and only where it can run (its own probe)."""
    problems = {"namespaces": "unshare: Operation not permitted", "rlimits": None}
    monkeypatch.setattr(sandbox, "probe", lambda isolation="namespaces": problems[isolation])
    with pytest.raises(ToolConfigError, match="unavailable here .*isolation: rlimits"):
        resolve_isolation("namespaces")
    with pytest.raises(ToolConfigError) as refused:
        resolve_isolation("auto")
    message = str(refused.value)
    assert "\n" not in message and "set isolation: rlimits" in message
    assert "files" in message and "sockets" in message
    with pytest.raises(ToolConfigError, match="unavailable"):
        resolve_tools(ToolsConfig(tools=["python"]))
    assert resolve_isolation("rlimits") == "rlimits"
    problems["rlimits"] = f"sandbox failed to start: Permission denied: {sys.executable!r}"
    with pytest.raises(ToolConfigError, match="'rlimits' cannot run code here .*nobody"):
        resolve_isolation("rlimits")
