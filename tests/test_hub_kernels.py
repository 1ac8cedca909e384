"""rlscale runs the models it loads with torch's own ops: importing it turns off the Hub
kernels that transformers would otherwise download on CUDA, unless the user asked for them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("given, expected", [(None, "NO"), ("YES", "YES")])
def test_importing_rlscale_turns_hub_kernels_off_unless_the_user_set_them(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "USE_HUB_KERNELS"}
    if given is not None:
        env["USE_HUB_KERNELS"] = given
    code = ("import rlscale, os; from transformers.integrations import hub_kernels; "
            "print(os.environ['USE_HUB_KERNELS'], hub_kernels._kernels_enabled())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [expected, str(expected == "YES")]
