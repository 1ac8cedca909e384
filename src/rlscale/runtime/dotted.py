"""Import a user's object named by `package.module:attribute` (a reward function, a verifier).

The current directory is put on `sys.path` first, as `python -m` does, so a module beside
the user's config (`my_rewards.py`, `examples/reward_fns.py`) imports without installing
it; verifier workers inherit that path. Every failure is one line naming the path and
what is wrong with it.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class DottedPathError(ValueError):
    """A `module:attribute` path that does not name an importable object (one line)."""


def import_object(path: str, *, what: str = "object") -> Any:
    if not isinstance(path, str) or path.count(":") != 1:
        raise DottedPathError(f"{what} '{str(path)[:80]}' must be 'package.module:name'")
    module_name, attribute = path.split(":")
    if not module_name or not attribute:
        raise DottedPathError(f"{what} '{path}' must be 'package.module:name'")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DottedPathError(f"{what} '{path}': cannot import module '{module_name}' "
                              f"({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # the module itself raised while being imported
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DottedPathError(f"{what} '{path}': importing '{module_name}' raised "
                              f"{type(exc).__name__}: {first}") from None
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise DottedPathError(f"{what} '{path}': module '{module_name}' has no "
                                  f"attribute '{attribute}'") from None
    return obj


def import_callable(path: str, *, what: str = "function") -> Any:
    obj = import_object(path, what=what)
    if not callable(obj):
        raise DottedPathError(f"{what} '{path}' is a {type(obj).__name__}, not callable")
    return obj
