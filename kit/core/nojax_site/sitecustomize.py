"""Run by Python at start-up where PYTHONPATH begins with this folder (kit.core.nojax.environ): install the kit's
finder that keeps JAX out of TensorFlow's import, then the environment's own sitecustomize, if it has one."""

import importlib.machinery
import importlib.util
import os
import sys

from kit.core import nojax

nojax.install()
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [entry for entry in sys.path if os.path.abspath(entry or ".") != _here])
if _spec is not None and _spec.loader is not None:  # the one this folder shadows
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
