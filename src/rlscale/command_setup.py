"""What every rlscale command does to its process before heavy work: every core to torch
(unless OMP_NUM_THREADS says otherwise) and the libraries' own progress bars and chatter off
(our progress and messages are the output). Its own module so that the command modules
(cli.py, experiments/commands.py, ...) share it without importing each other."""

from __future__ import annotations

import os


def prepare_command_process() -> None:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
