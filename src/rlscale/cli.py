"""The `rlscale` command: parse arguments, build a config, call one run function."""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from .command_setup import prepare_command_process
from .experiments.commands import app as experiments_app
from .runtime.errors import interrupted, run_guarded


class CommandList(TyperGroup):
    """A command group whose list shows each command's first paragraph whole (wrapped), as
    typer's rich help did: click cuts it to one 80-column line, or at the first full stop
    (even the one of "e.g.")."""

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                text = inspect.cleandoc(command.short_help or command.help or "")
                rows.append((name, " ".join(text.split("\n\n")[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# Help in click's plain layout (every sub-app inherits the markup mode): typer's rich panels
# print `<bool>` beside every flag and cut long option names at 80 columns; the plain one
# keeps each name whole and grows to 120 columns in a wider terminal.
app = typer.Typer(help="rlscale: RLVR for language models and AlphaZero-style self-play.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  rich_markup_mode=None, context_settings={"max_content_width": 120},
                  cls=CommandList)
rlvr_app = typer.Typer(help="Post-train a causal LM against a verifier (GRPO family).",
                       no_args_is_help=True)
app.add_typer(rlvr_app, name="rlvr", cls=CommandList)
app.add_typer(experiments_app, name="experiments", cls=CommandList)

PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"


def installed_version() -> str:
    """The installed distribution's version (its metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlscale")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rlscale {installed_version()}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="print the version and exit")] = False) -> None:
    pass


def _parse_ks(text: str) -> tuple[int, ...]:
    """`--k 1,4,8` as sorted distinct positive integers, or a one-line ValueError."""
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--k needs comma-separated positive integers, got '{text[:40]}'") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"--k needs positive integers, got '{text[:40]}'")
    return ks


def _threads() -> None:
    prepare_command_process()


@app.command()
def quickstart(
        recipe: Annotated[str, typer.Argument(
            help="arithmetic (answers of 3-4 characters) or reasoning (step-by-step traces)")
        ] = "arithmetic",
        out: Annotated[Path | None, typer.Option(
            help="where everything is written (default runs/quickstart, runs/reasoning)")] = None,
        tiny: Annotated[bool, typer.Option(
            "--tiny", help="the same pipeline at a smoke-test budget, into runs/quickstart_tiny "
            "(arithmetic: about a minute on an idle 2-core machine; reasoning: several); it "
            "shows the outputs, not the measured lift")] = False,
) -> None:
    """Build a tiny model, SFT it, measure, improve it with GRPO, measure again."""
    from .rlvr.quickstart import run_quickstart

    _threads()
    run_guarded(run_quickstart, out, recipe, tiny)


@app.command("sft")
def sft_command(config: Path, overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted overrides, e.g. steps=500 data.wrong_share=0.2")] = None,
        overwrite: Annotated[bool, typer.Option(
            help="replace an earlier run and model that rlscale wrote there")] = False,
        resume: Annotated[bool, typer.Option(
            help="continue the run in run_dir from its newest checkpoint")] = False,
        allow_config_change: Annotated[bool, typer.Option(
            help="--resume with a config that changes the math; recorded in "
                 "config_changes.jsonl")] = False) -> None:
    """Supervised fine-tuning on task demonstrations (the base model for RL)."""
    from .rlvr.config import SFTConfig, load_command_config
    from .rlvr.distill import sft
    from .runtime.trackers import check_trackers

    def go():
        cfg = load_command_config(SFTConfig, config, overrides or [])
        check_trackers(cfg.logging)  # before any work, not after the model is loaded
        try:
            path = sft(cfg, overwrite=overwrite, resume=resume,
                       allow_config_change=allow_config_change)
        except KeyboardInterrupt:
            interrupted(cfg.run_dir, ["rlscale", "sft", str(config), *(overrides or [])])
        typer.echo(f"model written to {path}")

    _threads()
    run_guarded(go)


@rlvr_app.command("init-model")
def init_model_command(out: Annotated[Path, typer.Option(help="output folder")],
                       preset: Annotated[str, typer.Option(help="tiny | small | medium")] = "tiny",
                       seed: int = 0,
                       overwrite: Annotated[bool, typer.Option(
                           help="replace a model that rlscale wrote there")] = False) -> None:
    """Build a freshly initialised model from a preset and save it as a HF folder."""
    from .rlvr.model import init_model

    _threads()
    path = run_guarded(init_model, preset, out, seed, overwrite=overwrite)
    typer.echo(f"model written to {path}")


@rlvr_app.command("train")
def train_command(
    config: Path,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted overrides, e.g. objective=dapo train.lr=1e-4")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the last checkpoint")] = False,
    overwrite: Annotated[bool, typer.Option(
        help="replace the earlier run in run_dir (only rlscale's own files)")] = False,
    allow_config_change: Annotated[bool, typer.Option(
        help="--resume with a config that changes the math; recorded in config_changes.jsonl"
    )] = False,
) -> None:
    """Train with a GRPO-family objective; every config key: docs/config.md."""
    from .rlvr.config import RLVRConfig, load_command_config
    from .rlvr.loop import RLVRRun
    from .runtime.trackers import check_trackers

    def go():
        cfg = load_command_config(RLVRConfig, config, overrides or [])
        check_trackers(cfg.logging)  # before any work, not after the model is loaded
        try:
            path = RLVRRun(cfg, resume=resume, overwrite=overwrite,
                           allow_config_change=allow_config_change).train()
        except KeyboardInterrupt:
            interrupted(cfg.run_dir, ["rlscale", "rlvr", "train", str(config), *(overrides or [])])
        typer.echo(f"final model: {path}")

    _threads()
    run_guarded(go)


@rlvr_app.command("eval")
def eval_command(
    model: Annotated[Path, typer.Option(
        help="a local HF model folder, or a `rlvr train` run directory: its final/ model, else "
             "its newest checkpoint (and its config.yaml when neither --task nor --config)")],
    task: Annotated[str | None, typer.Option(help="task name, e.g. arithmetic")] = None,
    config: Annotated[Path | None, typer.Option(
        help="a train config: its task (name, options), prompt format, max_new_tokens and "
        "rollout.tools")] = None,
    split: Annotated[str, typer.Option(
        help="test (held out by hash), train, or ood (arithmetic: one digit more than "
             "training; countdown: one number more; long_arithmetic: a term with the digit 7, "
             "which no training prompt has)")] = "test",
    seed: int = 0,
    prompts: Annotated[int, typer.Option(help="held-out prompts to evaluate")] = 500,
    samples: Annotated[int, typer.Option(help="samples per prompt (n)")] = 0,
    k: Annotated[str, typer.Option(help="comma-separated k for pass@k")] = "1",
    max_new_tokens: Annotated[int | None, typer.Option(
        help="default: the config's rollout.max_new_tokens, else the task's own budget "
             "(arithmetic 8, countdown 16, long_arithmetic 256; other tasks 8)")] = None,
    temperature: Annotated[float, typer.Option(
        help="0: greedy (argmax) decoding, one sample per prompt")] = 1.0,
    top_p: float = 1.0,
    chat_template: bool = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    plot: Annotated[Path | None, typer.Option(help="also write a pass@k plot here (PNG)")] = None,
) -> None:
    """Unbiased pass@k on held-out prompts."""
    from random import Random

    from .rlvr.evaluate import check_eval_arguments, evaluate, find_eval_model, task_max_new_tokens
    from .rlvr.model import load_model
    from .rlvr.tasks import make_task
    from .rlvr.tasks.base import EVAL_SPLITS

    def go():
        ks = _parse_ks(k)
        n = samples or max(ks)
        if split not in EVAL_SPLITS:
            raise ValueError(f"--split must be one of {', '.join(EVAL_SPLITS)}, got '{split[:40]}'")
        found = find_eval_model(model)
        # a run directory alone is evaluated as it trained: its recorded config
        train_config = config if task is not None or config is not None else found.run_config
        if (task is None) == (train_config is None):
            raise ValueError("give --task NAME or --config CONFIG (a train config), not both")
        use_chat, system_prompt, new_tokens = chat_template, None, max_new_tokens
        tools_cfg = None
        if train_config is not None:
            from .rlvr.config import RLVRConfig, load_command_config

            cfg = load_command_config(RLVRConfig, train_config, [f"model.path={found.folder}"])
            use_chat = chat_template or cfg.model.chat_template
            system_prompt = cfg.model.system_prompt
            new_tokens = max_new_tokens or cfg.rollout.max_new_tokens
            task_obj = make_task(cfg.task.name, **cfg.task.options)
            tools_cfg = cfg.rollout.tools if cfg.rollout.tools.tools else None
        else:
            task_obj = make_task(task)
            new_tokens = max_new_tokens or task_max_new_tokens(task_obj)
        check_eval_arguments(prompts=prompts, samples=n, ks=ks, max_new_tokens=new_tokens,
                             temperature=temperature, top_p=top_p)
        task_obj.sample(split, Random(seed))  # a split the task lacks fails before the model loads
        plot_path = _png_path(plot, "pass_at_k.png") if plot is not None else None
        if found.folder != model:
            typer.echo(f"model: {found.folder}", err=True)
        lm, tokenizer = load_model(found.folder)
        with contextlib.ExitStack() as stack:  # the config's tools, if it lists any
            tools = None
            if tools_cfg is not None:
                from .rlvr.tool_turns import RunnerToolTurns

                tools = RunnerToolTurns.from_config(tools_cfg, tokenizer)
                stack.callback(tools.close)
            result = evaluate(lm, tokenizer, task_obj, split=split, seed=seed, prompts=prompts,
                              samples=n, ks=ks, max_new_tokens=new_tokens,
                              temperature=temperature, top_p=top_p, chat_template=use_chat,
                              system_prompt=system_prompt, tools=tools, progress=True)
        if plot is not None:
            from .rlvr.plots import plot_pass_at_k

            plot_pass_at_k({str(model): result.pass_at}, plot_path)
        if as_json:
            typer.echo(json.dumps({key: value for key, value in result.as_dict().items()
                                   if key != "seconds"}))
        else:
            for kk, v in result.pass_at.items():
                typer.echo(f"pass@{kk}: {v:.4f}")
            typer.echo(f"prompts: {result.n}  samples/prompt: {result.samples}  "
                       f"mean length: {result.mean_length:.2f}  ({result.seconds:.1f}s)")

    _threads()
    run_guarded(go)


@rlvr_app.command("passk")
def passk_command(
    model: Annotated[list[Path], typer.Option(
        help="model folder or `rlvr train` run directory; repeat for several")],
    task: Annotated[str, typer.Option(help="task name")],
    out: Annotated[Path, typer.Option(help="the plot (PNG); a JSON of the numbers beside it")],
    k: str = "1,2,4,8,16,32,64",
    prompts: int = 200,
    seed: int = 0,
    max_new_tokens: Annotated[int | None, typer.Option(
        help="default: the task's own budget (as rlvr eval --task)")] = None,
    temperature: float = 1.0,
) -> None:
    """pass@k against k for several models on one chart (e.g. base against trained)."""
    from .rlvr.evaluate import check_eval_arguments, evaluate, find_eval_model, task_max_new_tokens
    from .rlvr.model import check_model_dir, load_model
    from .rlvr.plots import plot_pass_at_k
    from .rlvr.tasks import make_task

    def go():
        ks = _parse_ks(k)
        task_obj = make_task(task)
        new_tokens = max_new_tokens or task_max_new_tokens(task_obj)
        check_eval_arguments(prompts=prompts, samples=max(ks), ks=ks,
                             max_new_tokens=new_tokens, temperature=temperature, top_p=1.0)
        folders = [find_eval_model(path).folder for path in model]
        for folder in folders:  # every model checked before the first is evaluated
            check_model_dir(folder)
        plot_path = _png_path(out, "pass_at_k.png")
        curves = {}
        for path, folder in zip(model, folders, strict=True):
            lm, tokenizer = load_model(folder)
            result = evaluate(lm, tokenizer, task_obj, seed=seed, prompts=prompts,
                              samples=max(ks), ks=ks, max_new_tokens=new_tokens,
                              temperature=temperature, progress=True)
            curves[str(path)] = result.pass_at
            typer.echo(f"{path}: " + "  ".join(f"pass@{kk} {v:.3f}" for kk, v in result.pass_at.items()))
        plot_pass_at_k(curves, plot_path, title=f"{task}: pass@k, {prompts} held-out prompts")
        plot_path.with_suffix(".json").write_text(json.dumps(curves, indent=1))
        typer.echo(f"plot written to {plot_path}")

    _threads()
    run_guarded(go)


def _png_path(path: Path, name: str) -> Path:
    """An existing folder gets the plot inside it, not a `DIR.png` beside it."""
    return path / name if path.is_dir() else path


fleet_app = typer.Typer(help="Model RL fleets: discrete-event simulation of sync/async modes.",
                        no_args_is_help=True)
app.add_typer(fleet_app, name="fleet", cls=CommandList)


@fleet_app.command("simulate")
def fleet_simulate_command(
    config: Path,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted overrides, e.g. inference.workers=32 workload.steps=10")] = None,
    out: Annotated[Path | None, typer.Option(help="write plots and results JSON here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Simulate every mode of a fleet config (sync, async k, in-flight k; static and
    continuous batching) and compare throughput, utilisation and staleness."""
    from .runtime.simulate_cli import run_fleet_simulation

    run_guarded(run_fleet_simulation, config, overrides or [], out, as_json)


def _mount_zero() -> None:
    try:
        from .zero.commands import app as zero_app
    except ImportError as exc:  # the zero loop is optional at import time only in development
        if "rlscale.zero.commands" not in str(exc):
            raise
        return
    app.add_typer(zero_app, name="zero", cls=CommandList)


_mount_zero()


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
