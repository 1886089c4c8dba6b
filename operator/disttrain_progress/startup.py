"""Progress reports and checkpoints on request for an unchanged Keras script (issue 33): imported
at interpreter start-up by a `.pth` line in our images' site-packages, it waits for Keras to be
imported and wraps `Model.fit` so that each call gets disttrain_progress's callbacks, unless the
script passes them itself: the progress callback, and with a BackupAndRestore callback in the fit,
a checkpoint through it whenever the operator asks (keras_checkpoint.py).

It costs nothing where it has nothing to do: outside a DistTrainJob's pod (no DISTTRAIN_*_DIR in
the environment), or with DISTTRAIN_KERAS_HOOK=0, it installs nothing; inside one it adds a
finder to sys.meta_path that only looks at the names in KERAS_MODULES and steps aside once it has
patched them. Keras itself is never imported here: a script that doesn't use it doesn't load it.
Any trouble is said once on stderr and never becomes the script's.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# The modules whose Model.fit is wrapped once imported: Keras 2 (tf_keras, which tf.keras is with
# TF_USE_LEGACY_KERAS=1, as our images set) and Keras 3.
KERAS_MODULES = ("tf_keras", "keras")
MARK = "_disttrain_progress"  # on our callbacks, and on a wrapped fit
FIT_CALLBACKS_POSITION = 5  # Model.fit(x, y, batch_size, epochs, verbose, callbacks, ...)


def wanted(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    if environ.get("DISTTRAIN_KERAS_HOOK", "1") == "0":
        return False
    return bool(environ.get("DISTTRAIN_PROGRESS_DIR") or environ.get("DISTTRAIN_CHECKPOINT_DIR"))


def wrap_fit(model_class: type, callbacks: Callable[[Sequence[Any], Any], Sequence[Any]]) -> None:
    """`model_class.fit` with `callbacks(given, model)` added to each call's own (which of ours it lacks)."""
    original = getattr(model_class, "fit")  # noqa: B009 (a class of any Keras)
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = list(args)  # type: ignore[assignment]
        positional = len(args) > FIT_CALLBACKS_POSITION
        given = list((args[FIT_CALLBACKS_POSITION] if positional else kwargs.get("callbacks")) or [])
        try:
            given += list(callbacks(given, self))
        except Exception as err:  # never the training's failure
            _say(f"no progress callbacks added: {type(err).__name__}: {err}")
        if positional:
            args[FIT_CALLBACKS_POSITION] = given  # type: ignore[index]
        else:
            kwargs["callbacks"] = given
        return original(self, *args, **kwargs)

    setattr(fit, MARK, True)
    model_class.fit = fit  # type: ignore[attr-defined]


def default_callbacks(given: Sequence[Any], model: Any = None) -> list[Any]:
    """Progress reports; and, when the fit has a BackupAndRestore callback, a checkpoint with it
    whenever the operator asks for one (keras_checkpoint.py), but under a ParameterServerStrategy,
    where tf_keras refuses batch-level callbacks ("Batch-level Callbacks are not supported")."""
    import disttrain_progress
    from disttrain_progress import keras_checkpoint

    rank = disttrain_progress.mpi_rank()  # in an MPI job every pod may report: rank 0's process does
    added = []
    if not any(getattr(c, MARK, False) for c in given):  # the script may add its own (our examples do)
        added.append(disttrain_progress.keras_callback(disttrain_progress.for_rank(rank) if rank is not None else None))
    backup = next((c for c in given if type(c).__name__ == "BackupAndRestore"), None)
    coordinated = getattr(getattr(model, "distribute_strategy", None), "_should_use_with_coordinator", False)
    if backup is not None and not coordinated and not any(getattr(c, keras_checkpoint.MARK, False) for c in given):
        added.append(keras_checkpoint.checkpoint_callback(backup))
    return added


class KerasFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a name in KERAS_MODULES it asks the finders after it, and has the
    module's loader patch Model.fit once the module has run."""

    def __init__(self, patch: Callable[[ModuleType], None]) -> None:
        self.patch = patch

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name not in KERAS_MODULES:
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else ():
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Patching(spec.loader, self.patch)
                return spec
            if spec is not None:
                return spec
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception as err:
            _say(f"Keras not hooked: {type(err).__name__}: {err}")

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


def patch_keras(module: ModuleType,
                callbacks: Callable[[Sequence[Any], Any], Sequence[Any]] = default_callbacks) -> None:
    model = getattr(module, "Model", None)
    if isinstance(model, type) and hasattr(model, "fit"):
        wrap_fit(model, callbacks)


def install() -> None:
    if not wanted() or any(isinstance(f, KerasFinder) for f in sys.meta_path):
        return
    for name in KERAS_MODULES:
        if name in sys.modules:  # imported before us (a .pth ordering): patched now
            patch_keras(sys.modules[name])
    sys.meta_path.insert(0, KerasFinder(patch_keras))


def _say(message: str) -> None:
    print(f"disttrain_progress: {message}", file=sys.stderr, flush=True)


install()
