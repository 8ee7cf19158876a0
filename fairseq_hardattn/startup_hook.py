"""fairseq's own commands in the environment this project installs, without
``--user-dir``: torch >= 2.6 reads checkpoints with ``weights_only=True``,
which refuses the ``argparse.Namespace`` and numpy scalars that fairseq
checkpoints hold, so a plain ``fairseq-train --arch transformer`` could not
be decoded by ``fairseq-generate`` (``UnpicklingError``). On request
(``python -m fairseq_hardattn --install-startup-hook``: nothing installs it
otherwise) a ``.pth`` file in the environment's site-packages loads this
module at interpreter start, without the plugin; it imports nothing until
fairseq's ``checkpoint_utils`` is imported, then:

- allows exactly those types to ``torch.load`` (the plugin does the same
  when it is loaded, ``compat.checkpoints``);
- stops, in one line saying to add ``--user-dir``, where a checkpoint of this
  plugin is loaded without it (fairseq would say ``Requested model type``).

It never loads the plugin: fairseq behaves as fairseq otherwise.
"""

import importlib.abc
import importlib.util
import os
import sys

PTH_NAME = "fairseq_hardattn_startup.pth"
WATCHED = "fairseq.checkpoint_utils"


def fairseq_safe_globals():
    """The types fairseq checkpoints pickle besides tensors: the options of
    models defined with ``--arch`` (``argparse.Namespace``), numpy
    scalars/arrays where metrics were recorded (``--eval-bleu``)."""
    import argparse

    import numpy

    multiarray = (getattr(numpy, "_core", None) or numpy.core).multiarray  # numpy 2 / 1
    allowed = [argparse.Namespace, numpy.ndarray, numpy.dtype]
    for name in ("_reconstruct", "scalar"):
        function = getattr(multiarray, name)
        allowed.append(function)
        # checkpoints written under numpy 1 name the same functions numpy.core.*
        allowed.append((function, f"numpy.core.multiarray.{name}"))
    dtypes = getattr(numpy, "dtypes", None)  # numpy >= 1.25
    for name in ("Int64DType", "Int32DType", "Float64DType", "Float32DType", "Float16DType", "BoolDType"):
        if dtypes is not None and hasattr(dtypes, name):
            allowed.append(getattr(dtypes, name))
    return allowed


def _plugin_loaded() -> bool:
    return any(name == "fairseq_hardattn" or name.endswith(".fairseq_hardattn") for name in sys.modules)


def _needs_the_plugin(path, error=None, state=None) -> bool:
    if error is not None:  # the plugin's own class in a checkpoint saved until 2026-11
        return "fairseq_hardattn" in str(error)
    cfg = state.get("cfg") or {}
    common, model = cfg.get("common") or {}, cfg.get("model")
    user_dir = str((common.get("user_dir") if hasattr(common, "get") else None) or "")
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = getattr(model, "arch", None) or getattr(model, "_name", None)
    return "fairseq_hardattn" in user_dir and arch not in ARCH_MODEL_REGISTRY


def _checked(load_checkpoint_to_cpu):
    def load(path, *args, **kwargs):
        try:
            state = load_checkpoint_to_cpu(path, *args, **kwargs)
        except Exception as error:
            if _plugin_loaded() or not _needs_the_plugin(path, error=error):
                raise
            state = None
        if _plugin_loaded() or (state is not None and not _needs_the_plugin(path, state=state)):
            return state
        raise SystemExit(f"fairseq-hardattn: error: {path} is a checkpoint of the fairseq-hardattn "
                         f"plugin: load it with --user-dir \"$(python -m fairseq_hardattn)\" (the hub: "
                         f"user_dir=)")

    load.__wrapped__ = load_checkpoint_to_cpu
    return load


def _after_import(module):
    import torch

    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
        torch.serialization.add_safe_globals(fairseq_safe_globals())
    module.load_checkpoint_to_cpu = _checked(module.load_checkpoint_to_cpu)


class _Watch(importlib.abc.MetaPathFinder):
    """Runs ``_after_import`` once fairseq's checkpoint_utils is imported."""

    fairseq_hardattn_watch = True

    def find_spec(self, name, path, target=None):
        if name != WATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _after_import(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def watch():
    """Called by the ``.pth`` line at interpreter start."""
    if WATCHED in sys.modules:
        _after_import(sys.modules[WATCHED])
    elif not any(getattr(finder, "fairseq_hardattn_watch", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watch())


def pth_line(source: str) -> str:
    """The ``.pth`` line that loads ``source`` (this file) as a module of its
    own at interpreter start, skipped when the file is gone."""
    return (f"import os, importlib.util as u; p = {source!r}; "
            f"s = os.path.exists(p) and u.spec_from_file_location('fairseq_hardattn_startup', p); "
            f"m = s and u.module_from_spec(s); s and s.loader.exec_module(m); m and m.watch()\n")


def install(site_packages=None) -> str:
    """Write the ``.pth`` file into ``site_packages`` (default: this
    interpreter's); returns its path."""
    import sysconfig

    target = os.path.join(site_packages or sysconfig.get_paths()["purelib"], PTH_NAME)
    with open(target, "w") as f:
        f.write(pth_line(os.path.abspath(__file__)))
    return target

