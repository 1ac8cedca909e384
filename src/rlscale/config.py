"""Typed configs: pydantic models, YAML files and dotted command-line overrides.

Every config model derives from `StrictModel`, so an unknown or ill-typed field is an error
that names the field, never a silently ignored typo.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import pydantic
import yaml


class ConfigError(ValueError):
    """A config that cannot be used; the message is one line naming the problem."""


class StrictModel(pydantic.BaseModel):
    # allow_inf_nan=False: a weight, rate or budget of nan/inf is an error naming the field,
    # not a run that skips every update and exits 0.
    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True,
                                       allow_inf_nan=False)


M = TypeVar("M", bound=StrictModel)

# Where a run computes (`rlvr train`, `sft`, `zero train`); rlscale.runtime.device resolves it.
Device = Literal["auto", "cpu", "cuda"]
# The largest learning rate a config accepts (both loops): a step far above 1 overflows the
# optimisers' float32 arithmetic, so it is a one-line config error, not a traceback from AdamW.
MAX_LR = 10.0
DEVICE_HELP = "auto: a CUDA GPU when torch sees one, else the CPU"
ComputeDtypeName = Literal["auto", "float32", "bfloat16"]
COMPUTE_DTYPE_HELP = ("bfloat16 = autocast with fp32 weights; auto = bfloat16 where the run's "
                      "own model (a matmul probe for one too big to time) runs >= 1.15x faster "
                      "in it than in float32 on this device (cached per machine, torch "
                      "version, thread count and model shape), else float32; float32 "
                      "unprobed on a CPU without bf16 instructions, and float32 uncached "
                      "when other tasks crowded the cores while it was timed")


class NonFiniteGuardConfig(StrictModel):
    """`health`: the non-finite guard of both loops (runtime/health.py); a Zero "step" is an
    iteration."""

    max_nonfinite_steps: int = pydantic.Field(
        3, ge=1, description="non-finite steps in a row (each skipped) that stop the run")
    nonfinite_guard: Literal["snapshot", "check", "off"] = pydantic.Field(
        "snapshot", description="snapshot: copy the weights and optimiser state before each "
        "step and restore a non-finite one; check: no copy, skip non-finite updates and stop "
        "at once if the weights still go non-finite; off: no test")


class LoggingConfig(StrictModel):
    """Experiment trackers beside metrics.jsonl and TensorBoard (runtime/trackers.py). Their
    files live in the run directory: `wandb/` (offline unless wandb has credentials) and
    `trackio/` (a local database)."""

    wandb: bool = pydantic.Field(False, description="mirror the metrics to Weights & Biases")
    trackio: bool = pydantic.Field(False, description="mirror the metrics to trackio")
    project: str = pydantic.Field("rlscale", min_length=1, description="the trackers' project")
    run_name: str | None = pydantic.Field(
        None, description="the run's name in the trackers; None: the run directory's name")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names a key twice; YAML keeps the last silently (a second `train:` section
    replaced the first, and a run trained at its lr)."""

    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        super().__init__(None, None, f"key '{key}' appears twice (lines {first.line + 1} and "
                         f"{second.line + 1}); keep one", second)
        self.key = key


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string; read floats as YAML 1.2
    and everyone else does. A key given twice in one mapping is an error, not the last one
    winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` merges, by design
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class names it
                break
            if first is not key_node.start_mark:
                raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+][0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _parse_value(text: str) -> Any:
    # YAML's scalar rules give the natural reading of `lr=1e-4`, `flag=true`, `k=[1,2]`.
    try:
        return _load_yaml(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, _, raw = item.partition("=")
        set_dotted(data, key, _parse_value(raw), what=f"override '{item}'")
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any, what: str | None = None) -> None:
    """data['a']['b']['c'] = value for key 'a.b.c', creating sections as needed."""
    what = what or f"key '{key}'"
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{what} has an empty key")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{what}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _format_error(err: pydantic.ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    if first["type"] == "extra_forbidden":
        msg = f"unknown field '{loc}'"
    elif not first["loc"]:
        msg = first["msg"].removeprefix("Value error, ")
    else:
        got = repr(first.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        msg = f"field '{loc}': {first['msg']} (got {got})"
    more = len(err.errors()) - 1
    return f"{source}: {msg}" + (f" (+{more} more)" if more else "")


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = _load_yaml(path.read_text()) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (invalid UTF-8)") from None
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}: {exc.problem}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise ConfigError(f"{path}: invalid YAML{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def build_config(model_cls: type[M], data: dict[str, Any], source: str = "config") -> M:
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None


def _blamed_override(err: pydantic.ValidationError, overrides: list[str]) -> str | None:
    """The command-line override that set the field of the first complaint, if one did."""
    loc = ".".join(str(p) for p in err.errors()[0]["loc"])
    for item in reversed(overrides):  # the last override of a key wins
        key = item.partition("=")[0].strip()
        if loc == key or loc.startswith(key + ".") or key.startswith(loc + "."):
            return item
    return None


def load_config(
    model_cls: type[M], path: str | Path | None, overrides: list[str] | None = None
) -> M:
    """Read YAML (if a path is given), apply dotted overrides, validate strictly.

    An error names where the bad value came from: the override on the command line that set
    it, else the file."""
    overrides = list(overrides or [])
    data = read_yaml(path) if path is not None else {}
    apply_overrides(data, overrides)
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as err:
        item = _blamed_override(err, overrides)
        source = (f"command line ({item[:60]!r})" if item is not None
                  else str(path) if path is not None else "config")
        if item is None and overrides and not err.errors()[0]["loc"]:
            # a rule across fields: the file and the command line together broke it
            shown = ", ".join(repr(o[:40]) for o in overrides[:3])
            source = f"{source} with the command line ({shown}{', ...' if len(overrides) > 3 else ''})"
        raise ConfigError(_format_error(err, source)) from None


def config_to_dict(cfg: StrictModel) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def dump_config(cfg: StrictModel, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
