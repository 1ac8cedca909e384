"""`rlscale rlvr ...`, and the language-model loop's top-level commands `quickstart` and
`sft` (`TOP_LEVEL`, added to the root app by rlscale.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..runtime.errors import interrupted, run_guarded
from .common import config_from_options, parse_ks, png_path, prepare_command_process

app = typer.Typer(help="Post-train a causal LM against a verifier (GRPO family).",
                  no_args_is_help=True)


def quickstart(
        recipe: Annotated[str, typer.Argument(
            help="arithmetic (answers of 3-4 characters), reasoning (step-by-step traces), "
            "emergence (RL from outcome reward on a base that never saw a step-by-step "
            "solution: docs/emergence.md) or smollm (a real pretrained model, "
            "SmolLM2-135M-Instruct: make smollm)")
        ] = "arithmetic",
        out: Annotated[Path | None, typer.Option(
            help="where everything is written (default runs/quickstart, runs/reasoning, "
            "runs/emergence)")] = None,
        tiny: Annotated[bool, typer.Option(
            "--tiny", help="the same pipeline at a smoke-test budget, into runs/quickstart_tiny "
            "(arithmetic: about a minute on an idle 2-core machine; reasoning: several); it "
            "shows the outputs, not the measured lift")] = False,
) -> None:
    """Build a tiny model, SFT it, measure, improve it with GRPO, measure again."""
    from ..rlvr.quickstart import run_quickstart

    prepare_command_process()
    run_guarded(run_quickstart, out, recipe, tiny)


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
    from ..rlvr.config import SFTConfig, load_command_config
    from ..rlvr.distill import sft
    from ..runtime.trackers import check_trackers

    def go():
        cfg = load_command_config(SFTConfig, config, overrides or [])
        check_trackers(cfg.logging)  # before any work, not after the model is loaded
        try:
            path = sft(cfg, overwrite=overwrite, resume=resume,
                       allow_config_change=allow_config_change)
        except KeyboardInterrupt:
            interrupted(cfg.run_dir, ["rlscale", "sft", str(config), *(overrides or [])])
        typer.echo(f"model written to {path}")

    prepare_command_process()
    run_guarded(go)


# The root app's commands that live here; rlscale.cli adds them by these names.
TOP_LEVEL = {"quickstart": quickstart, "sft": sft_command}


@app.command("init-model")
def init_model_command(out: Annotated[Path, typer.Option(help="output folder")],
                       preset: Annotated[str, typer.Option(help="tiny | small | medium")] = "tiny",
                       seed: int = 0,
                       overwrite: Annotated[bool, typer.Option(
                           help="replace a model that rlscale wrote there")] = False) -> None:
    """Build a freshly initialised model from a preset and save it as a HF folder."""
    from ..rlvr.model import init_model

    prepare_command_process()
    path = run_guarded(init_model, preset, out, seed, overwrite=overwrite)
    typer.echo(f"model written to {path}")


@app.command("train")
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
    from ..rlvr.config import RLVRConfig, load_command_config
    from ..rlvr.learner_group import follow, torchrun_rank
    from ..rlvr.loop import RLVRRun
    from ..runtime.device import resolve_device
    from ..runtime.trackers import check_trackers

    def go():
        cfg = load_command_config(RLVRConfig, config, overrides or [])
        if torchrun_rank() > 0:  # a learner rank of a torchrun launch: rank 0 runs the loop
            follow(resolve_device(cfg.device).type)
            return
        check_trackers(cfg.logging)  # before any work, not after the model is loaded
        try:
            path = RLVRRun(cfg, resume=resume, overwrite=overwrite,
                           allow_config_change=allow_config_change).train()
        except KeyboardInterrupt:
            interrupted(cfg.run_dir, ["rlscale", "rlvr", "train", str(config), *(overrides or [])])
        typer.echo(f"final model: {path}")

    prepare_command_process()
    run_guarded(go)


@app.command("eval")
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
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted overrides of the options' keys (docs/config.md), e.g. eval.prompts=50 "
             "eval.temperature=0.5 ks=1,8")] = None,
) -> None:
    """Unbiased pass@k on held-out prompts."""
    from ..rlvr.config import EvalConfig
    from ..rlvr.evaluate import plan_eval, run_eval

    def go():
        options = {  # each option is the command-line face of one EvalConfig key
            "model": ("--model", str(model)), "task": ("--task", task),
            "config": ("--config", None if config is None else str(config)),
            "split": ("--split", split), "eval.seed": ("--seed", seed),
            "eval.prompts": ("--prompts", prompts), "eval.samples": ("--samples", samples),
            "ks": ("--k", list(parse_ks(k))), "max_new_tokens": ("--max-new-tokens", max_new_tokens),
            "eval.temperature": ("--temperature", temperature), "top_p": ("--top-p", top_p),
            "chat_template": ("--chat-template", chat_template),
            "output": ("--json", "json" if as_json else "text"),
            "plot": ("--plot", None if plot is None else str(plot))}
        cfg = config_from_options(EvalConfig, options, overrides or [])
        plan = plan_eval(cfg)
        plot_path = png_path(Path(cfg.plot), "pass_at_k.png") if cfg.plot is not None else None
        if plan.folder != Path(cfg.model):
            typer.echo(f"model: {plan.folder}", err=True)
        result = run_eval(cfg, plan)
        if plot_path is not None:
            from ..rlvr.plots import plot_pass_at_k

            plot_pass_at_k({cfg.model: result.pass_at}, plot_path)
        _print_eval(result, cfg.output)

    prepare_command_process()
    run_guarded(go)


def _print_eval(result, output: str) -> None:
    if output == "json":
        typer.echo(json.dumps({key: value for key, value in result.as_dict().items()
                               if key != "seconds"}))
        return
    for k, value in result.pass_at.items():
        typer.echo(f"pass@{k}: {value:.4f}")
    typer.echo(f"prompts: {result.n}  samples/prompt: {result.samples}  "
               f"mean length: {result.mean_length:.2f}  ({result.seconds:.1f}s)")


@app.command("passk")
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
    from ..rlvr.evaluate import check_eval_arguments, evaluate, find_eval_model, task_max_new_tokens
    from ..rlvr.model import check_model_dir, load_model
    from ..rlvr.plots import plot_pass_at_k
    from ..rlvr.tasks import make_task

    def go():
        ks = parse_ks(k)
        task_obj = make_task(task)
        new_tokens = max_new_tokens or task_max_new_tokens(task_obj)
        check_eval_arguments(prompts=prompts, samples=max(ks), ks=ks,
                             max_new_tokens=new_tokens, temperature=temperature, top_p=1.0)
        folders = [find_eval_model(path).folder for path in model]
        for folder in folders:  # every model checked before the first is evaluated
            check_model_dir(folder)
        plot_path = png_path(out, "pass_at_k.png")
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

    prepare_command_process()
    run_guarded(go)
