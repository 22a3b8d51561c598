"""Warnings that point at the user's own line, however deep in pyro_bbb, Pyro or torch they are raised.

A warning's location is what Python shows and what its once-per-location filter keys on: a fixed ``stacklevel``
points at the user's call from one call path only (``predict`` called by the user, by ``fit``'s selection, through
``torch.no_grad``'s wrapper, from a Pyro SVI step). :func:`warn_at_caller` walks out of the library's frames instead.

Examples
--------
>>> import warnings
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     warn_at_caller("look here")
>>> caught[0].filename.startswith("<doctest")   # this example's own line, not a pyro_bbb file
True
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings

import pyro
import torch

__all__ = ["warn_at_caller"]

# frames in these files are the library's, not the user's: pyro_bbb, Pyro, torch, and the stdlib wrappers they use
_LIBRARY_FILES = (*(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                    for module in (sys.modules[__package__], pyro, torch)),
                  os.path.abspath(contextlib.__file__), os.path.abspath(functools.__file__))
# and the training frameworks that call pyro_bbb from their own loops (read by module name: imported or not)
_FRAMEWORKS = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "accelerate"})


def _is_library_frame(frame) -> bool:
    if os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARY_FILES):
        return True
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] in _FRAMEWORKS


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the first frame outside pyro_bbb, Pyro, torch and a training
    framework's loop (Lightning, Accelerate).

    Examples
    --------
    See the module example.
    """
    level, frame = 2, sys._getframe(1)
    while frame is not None and _is_library_frame(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
