"""docs/config.md, generated from the pydantic configs: every key of every command's config.

    python -m rlscale.config_docs [docs/config.md]     # = make docs-config

A field's description comes from the code, first found wins:

1. its `Field(description=...)`;
2. `NOTES` below, for a field whose code says nothing or says it badly (a comment that heads
   a group of fields rather than describing this one);
3. the comment the code puts on the field: the comment block right above it and any comment
   on its own lines (the Zero config is documented this way).

A field with none of them is a gap: `undocumented` lists it and tests/test_config_docs.py
fails on it, as it fails when docs/config.md differs from what this module writes. A note
for a field that has since gained a `Field(description=...)` fails the test too (`stale_notes`),
so descriptions move into the configs one by one and `NOTES` only shrinks.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal

import annotated_types
import pydantic
import yaml
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from . import simulator as fleet
from .config import LoggingConfig, StrictModel
from .rlvr import config as rlvr
from .zero import config as zero

DEFAULT_OUT = Path("docs/config.md")
COMMAND = "make docs-config"


@dataclass(frozen=True)
class Command:
    title: str  # the command that reads the config
    model: type[StrictModel]
    intro: str


COMMANDS = (
    Command("rlscale rlvr train", rlvr.RLVRConfig,
            "GRPO-family training of a causal LM against a verifier. Example: "
            "[`configs/rlvr/quickstart.yaml`](../configs/rlvr/quickstart.yaml); every file in "
            "`configs/rlvr/` without `_sft` in its name."),
    Command("rlscale sft", rlvr.SFTConfig,
            "Supervised fine-tuning on a task's demonstrations (the completion tokens are the "
            "targets, the prompt is context), or on a teacher's samples. Example: "
            "[`configs/rlvr/quickstart_sft.yaml`](../configs/rlvr/quickstart_sft.yaml)."),
    Command("rlscale rlvr eval", rlvr.EvalConfig,
            "Unbiased pass@k of one model on held-out prompts. Each option sets a key "
            "(`--prompts` is `eval.prompts`, `--k` is `ks`, `--json` is `output=json`)."),
    Command("rlscale zero train", zero.ZeroConfig,
            "AlphaZero-style self-play. The defaults suit tic-tac-toe on a laptop; "
            "[`configs/zero/`](../configs/zero/) overrides them per game and explains its "
            "choices in comments."),
    Command("rlscale fleet simulate", fleet.FleetConfig,
            "A discrete-event model of an RL fleet (sync / async / in-flight): "
            "[`configs/fleet/cluster.yaml`](../configs/fleet/cluster.yaml), the model in "
            "[fleet_simulator.md](fleet_simulator.md)."),
)

# Descriptions of fields whose code gives none (or a comment that heads a group of fields),
# keyed by the class that declares the field. The test fails on a note the field no longer
# needs; moving a note into the config as Field(description=...) is always welcome.
NOTES: dict[type, dict[str, str]] = {
    LoggingConfig: {},
    rlvr.LoraSettings: {
        "dropout": "dropout on the adapters' input",
    },
    rlvr.ModelConfig: {
        "dtype": "the weights' dtype",
    },
    rlvr.TeacherConfig: {
        "dtype": "the teacher's dtype",
    },
    rlvr.RewardTermConfig: {
        "weight": "the term's weight in the sum",
    },
    rlvr.RolloutConfig: {
        "prompts_per_step": "prompts per step",
        "max_new_tokens": "completion length cap (tokens)",
        "temperature": "sampling temperature",
        "top_p": "nucleus sampling: the smallest set of tokens with this much probability",
    },
    rlvr.LossConfig: {
        "advantage_std_normalize": "divide each group's advantages by its (population) std",
        "advantage_leave_one_out": "RLOO: the baseline is the mean of the other completions",
        "ratio_level": "the importance ratio: per token, per sequence, or per sequence "
                       "length-normalised (GSPO)",
        "clip_low": "eps_low: the ratio is clipped at 1 - clip_low",
        "clip_high": "eps_high: the ratio is clipped at 1 + clip_high (above clip_low: "
                     "clip-higher)",
        "aggregation": "how per-token terms become the loss (DESIGN's math conventions): "
                       "token-mean over the minibatch, 1/|y_i| per sequence (GRPO), a token "
                       "sum, or a token sum over a constant length (Dr. GRPO)",
        "kl_kind": "the per-token KL estimator: k1, k2 or k3",
        "dynamic_sampling": "drop groups whose rewards are all equal and draw more prompts "
                            "(at most rollout.max_extra_draws batches)",
        "overlong_penalty": "DAPO's soft overlong punishment, ramping to -1 over the last "
                            "overlong_buffer_frac of max_new_tokens",
        "overlong_buffer_frac": "the share of max_new_tokens, at the end of the budget, over "
                                "which the overlong penalty ramps from 0 to -1",
        "is_correction": "behaviour correction of pi_old / mu (sampler vs trainer): none, "
                         "tis (truncated at is_threshold) or mis (tokens outside "
                         "[1/is_threshold, is_threshold] masked)",
        "is_threshold": "C of the behaviour correction",
        "length_penalty_per_token": "reward minus this times the completion's tokens",
        "adaptive_length_penalty": "a length penalty scaled by the group's accuracy (more "
                                   "for groups the model already solves)",
        "entropy_top_rho": "the policy gradient on the top-rho share of tokens by entropy "
                           "only (1: every token)",
    },
    rlvr.TrainConfig: {
        "steps": "steps, one collected batch each",
        "lr": "AdamW learning rate",
        "warmup_steps": "linear learning-rate warm-up",
        "weight_decay": "AdamW weight decay",
        "grad_clip": "gradient-norm clip",
        "seed": "prompts, samples and shuffles are derived from (seed, step)",
    },
    rlvr.CheckpointConfig: {
        "keep": "checkpoints kept (the newest)",
    },
    rlvr.RuntimeConfig: {
        "mode": "where rollouts come from: sync, async or inflight (above)",
        "max_worker_restarts": "restarts of one inference worker in a row, with no call "
                               "answered between them (a crash loop ends the run); a dead "
                               "worker's requests are re-issued",
    },
    rlvr.RLVRConfig: {
        "run_dir": "the run directory",
        "tensorboard": "TensorBoard logging (RUN_DIR/tb)",
        "progress": "the live progress bar (one line per 30 s when stdout is not a terminal)",
    },
    rlvr.SFTDataConfig: {
        "seed": "the draw and corruption seed",
    },
    rlvr.SFTConfig: {
        "out": "the trained model (a Hugging Face folder)",
        "run_dir": "the run directory: config.yaml, metrics.jsonl, tb/",
        "model": "start from a local model (model.path); give this or init_preset",
        "steps": "optimiser steps",
        "batch_size": "demonstrations per step",
        "lr": "AdamW learning rate (linear warm-up, then cosine decay to 10%)",
        "warmup_steps": "linear learning-rate warm-up",
        "weight_decay": "AdamW weight decay",
        "seed": "batch sampling and initialisation seed",
        "threads": "torch CPU threads; 0 = all cores",
        "tensorboard": "TensorBoard logging (run_dir/tb)",
        "progress": "the live progress bar",
    },
    zero.GameConfig: {
        "name": "tictactoe, connect4, go, or any OpenSpiel game as openspiel:<name>",
        "kwargs": "the game's options, e.g. {size: 9, komi: 7.5} for Go (also max_moves, history)",
    },
    zero.NetworkConfig: {
        "channels": "channels of the residual tower",
    },
    zero.MCTSConfig: {
        "c_puct_base": "when set, c grows with the parent's visits: c + log((1 + N + base) / "
                       "base) (AlphaZero); null: constant c_puct",
        "dirichlet_fraction": "the share of the root prior replaced by Dirichlet noise "
                              "(self-play only)",
        "virtual_loss": "losses a pending leaf counts as, so the next selection goes elsewhere",
        "gumbel_considered": "Gumbel search: root actions sampled by Gumbel top-k",
        "gumbel_c_visit": "Gumbel search: c_visit of the completed-Q transform",
        "gumbel_c_scale": "Gumbel search: c_scale of the completed-Q transform",
    },
    zero.SelfPlayConfig: {
        "random_opening_plies": "random openings: the most random moves (1..this, drawn per "
                                "game)",
        "full_search_prob": "playout-cap randomisation: the chance of a full, recorded search",
        "resign_playout_share": "share of games played out with resignation off, to count "
                                "false resignations",
        "resign_tune_window": "threshold tuning: the newest played-out games it looks at",
        "resign_tune_min_games": "threshold tuning: would-be resignations needed before it "
                                 "trusts a rate",
    },
    zero.ReplayConfig: {
        "window_growth": "new window slots per sample added (from window_start to capacity)",
    },
    zero.TrainConfig: {
        "seed": "the network's initialisation, self-play and the learner's sampling",
        "batch_size": "positions per learner step",
        "optimizer": "sgd (with momentum) or adamw",
        "lr": "learning rate (see lr_steps)",
    },
    zero.RuntimeConfig: {
        "max_actor_restarts": "restarts of one actor in a row, with no call answered "
                              "between them (a crash loop ends the run); a dead actor's "
                              "games in flight are played anew, no game counted twice",
    },
    zero.CheckpointConfig: {
        "keep": "checkpoints kept (the newest)",
    },
    fleet.ResponseLengths: {
        "min": "shortest response (tokens)",
        "max": "longest response (tokens)",
    },
    fleet.Workload: {
        "prompts_per_step": "prompts per training step",
        "prompt_tokens": "tokens per prompt",
        "response": "response lengths",
    },
    fleet.Mode: {
        "mode": "sync, async or inflight",
        "batching": "static: a worker refills only when all its slots are done; continuous: "
                    "a finished slot is refilled at once",
    },
    fleet.FleetConfig: {
        "name": "the fleet's name, in the table's title and the JSON output",
        "seed": "the event queue's seed (response lengths)",
        "modes": "the modes simulated side by side",
    },
}

# Comments that are not descriptions.
_PRAGMA = re.compile(r"^(noqa|type:|pragma|fmt:)")


# ------------------------------------------------------------------------- descriptions


@cache
def _code_comments(cls: type) -> dict[str, str]:
    """field name -> the comment the class body puts on it (the block right above, and any
    comment on the field's own lines)."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent("".join(lines))
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not _PRAGMA.match(text):
                comments[tok.start[0]] = text
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    body = ast.parse(source).body[0]
    out: dict[str, str] = {}
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        own = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        text = " ".join(above + own).strip()
        if text:
            out[node.target.id] = text
    return out


def _declaring_class(model: type[StrictModel], name: str) -> type:
    for klass in model.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return klass
    return model


def describe(model: type[StrictModel], name: str) -> str | None:
    """The description of `model`'s field `name` (see the module docstring), or None."""
    info = model.model_fields[name]
    if info.description:
        return info.description
    owner = _declaring_class(model, name)
    note = NOTES.get(owner, {}).get(name)
    return note or _code_comments(owner).get(name)


# ------------------------------------------------------------------------- walking the models


@dataclass(frozen=True)
class Row:
    key: str
    kind: str
    default: str
    description: str | None
    owner: type


@dataclass(frozen=True)
class Section:
    key: str  # "" for the top level; "task.rewards[]" for a list's entries
    model: type[StrictModel]
    rows: tuple[Row, ...]
    intro: str = ""  # the class docstring, else the description of the field holding it


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    args = typing.get_args(annotation)
    if _is_union(annotation) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else typing.Union[rest]), True  # noqa: UP007
    return annotation, False


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _submodel(annotation: Any) -> tuple[type[StrictModel] | None, bool]:
    """(the config class a field holds, whether as a list of entries), or (None, False)."""
    inner, _ = _strip_optional(annotation)
    if isinstance(inner, type) and issubclass(inner, pydantic.BaseModel):
        return inner, False
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        if isinstance(item, type) and issubclass(item, pydantic.BaseModel):
            return item, True
    return None, False


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if _is_union(annotation):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "{" + f"{_type_name(args[0])}: {_type_name(args[1])}" + "}"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
           (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
           (annotated_types.MinLen, "min_length", "length >="))


def _bounds(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(meta, kind):
                parts.append(f"{sign} {_scalar(getattr(meta, attr))}")
    return ", ".join(parts)


def _scalar(value: Any) -> str:
    if isinstance(value, float) and value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"{value:g}"
    return yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip().removesuffix(
        "\n...").removesuffix("...").strip()


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, list):
        value = [v.model_dump(mode="json") if isinstance(v, pydantic.BaseModel) else v
                 for v in value]
    return f"`{_scalar(value)}`"


def sections(model: type[StrictModel], prefix: str = "", intro: str = "") -> list[Section]:
    """The model's fields as sections of rows, in declaration order; a nested config is a
    section of its own after its parent (an optional or list one also gets a row)."""
    rows: list[Row] = []
    later: list[Section] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        sub, many = _submodel(info.annotation)
        owner = _declaring_class(model, name)
        if sub is not None:
            _, optional = _strip_optional(info.annotation)
            sub_key = f"{key}[]" if many else key
            if many or optional:
                kind = f"list of `{sub_key}` entries" if many else f"`{sub_key}.*` or null"
                rows.append(Row(key, kind, _default(info), describe(model, name), owner))
            later.extend(sections(sub, sub_key + ".", describe(model, name) or ""))
            continue
        inner, optional = _strip_optional(info.annotation)
        kind = _type_name(inner) + (" \\| null" if optional else "")
        bounds = _bounds(info)
        rows.append(Row(key, f"{kind}, {bounds}" if bounds else kind, _default(info),
                        describe(model, name), owner))
    intro = _docstring(model) or intro
    return [Section(prefix.removesuffix("."), model, tuple(rows), intro), *later]


def undocumented() -> list[str]:
    """'command: key' of every field without a description."""
    return [f"{c.title}: {row.key}" for c in COMMANDS for s in sections(c.model)
            for row in s.rows if not row.description]


def stale_notes() -> list[str]:
    """Notes in NOTES that name no field, or a field with a Field(description=...) of its own."""
    out = []
    for owner, notes in NOTES.items():
        for name in notes:
            info = getattr(owner, "model_fields", {}).get(name)
            if info is None:
                out.append(f"{owner.__name__}.{name}: no such field")
            elif info.description:
                out.append(f"{owner.__name__}.{name}: has a Field(description=...); drop the note")
    return out


# ------------------------------------------------------------------------- markdown

_CODE_SPAN = re.compile(r"(`[^`]*`)")


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped, `<...>` shown (outside code spans)."""
    text = " ".join(text.split()).replace("|", "\\|")
    parts = _CODE_SPAN.split(text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;")
                   for p in parts)


def _docstring(model: type) -> str:
    doc = inspect.getdoc(model) if "__doc__" in vars(model) else None
    if not doc or doc == inspect.getdoc(pydantic.BaseModel):
        return ""
    return " ".join(doc.split())


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def _presets_table() -> list[str]:
    from .rlvr.objectives import PRESETS, Objective

    names = [f.name for f in fields(Objective)]
    lines = ["| `loss.*` | library default | " + " | ".join(f"`{p}`" for p in PRESETS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in PRESETS) + " |"]
    base = Objective()
    for name in names:
        values = [getattr(base, name)] + [getattr(p, name) for p in PRESETS.values()]
        lines.append(f"| `{name}` | " + " | ".join(f"`{_scalar(v)}`" for v in values) + " |")
    return lines


def render() -> str:
    out = [
        "# Config reference",
        "",
        f"<!-- Generated from the pydantic configs by `{COMMAND}` (src/rlscale/config_docs.py)."
        " Do not edit: change the config's Field(description=...) or comment and regenerate. -->",
        "",
        "Every command reads a YAML file, then `key=value` overrides with dotted keys "
        "(`train.lr=1e-4 objective=dapo`); YAML's rules read the values (`1e-4`, `true`, "
        "`[1, 2]`, `null`). Unknown or ill-typed fields, and numbers that are `nan` or `inf`, "
        "are one-line errors naming the field and where its value came from. A training run "
        "writes its resolved config to its run directory's `config.yaml`.",
        "",
    ]
    out += [f"- [`{c.title}`](#{_anchor(c.title)}): `{c.model.__name__}` "
            f"({c.model.__module__.removeprefix('rlscale.')})" for c in COMMANDS]
    for command in COMMANDS:
        out += ["", f"## {command.title}", "", command.intro]
        for section in sections(command.model):
            title = f"`{section.key}`" if section.key else "top level"
            out += ["", f"### {command.title}: {title}", ""]
            if section.intro:
                out += [_cell(section.intro).replace("\\|", "|"), ""]
            if section.model is rlvr.LossConfig:
                out += ["Each `loss.*` key left at `null` takes the value of the chosen "
                        "`objective` preset (`rlscale.rlvr.objectives.PRESETS`):", "",
                        *_presets_table(), ""]
            out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
            out += [f"| `{r.key}` | {r.kind} | {r.default} | {_cell(r.description or '')} |"
                    for r in section.rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_OUT
    gaps = undocumented()
    if gaps:
        print(f"error: {len(gaps)} config fields have no description: {', '.join(gaps)}",
              file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
