"""Caches for work that verifiers 0.4 (and pydantic under it) redo on every episode, put in
place once by the environment's process (`verifiers_server.py`) before it serves.

Imported only in the verifiers venv. Measured with cProfile in the environment's process
(128 episodes a step of the reverse-text taskset, `workbench bench eval --verifiers`): of
an episode's CPU, a fifth went to pydantic asking `inspect.signature` of each field's
`default_factory` (`list`, `dict`: a builtin's signature is parsed from its text, with
`compile`) every time verifiers' trace graph builds a node with `model_construct`, and
more to verifiers looking up its decorated reward/stop/metric methods by scanning every
class of the task's and harness's MRO, and to `inspect.signature` of each reward it calls.
Each answer is a function of the class or callable alone, so each is kept per class or
callable here; what is computed is what the library computes, once.

Each cache is put in place only on the release it was tested on (`verifiers_versions.py`:
another one keeps the library's own functions, slower, never wrong, and the log says why),
and replaces one library function only if that function is where this release keeps it;
`apply` says which were put in place.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import verifiers_versions

logger = logging.getLogger("workbench.verifiers_speedups")


def apply() -> list[str]:
    """Put each cache in place; returns the names of those that were."""
    caches = (
        ("pydantic default factories", "pydantic", _cache_default_factory_signatures),
        ("verifiers decorated methods", "verifiers", _cache_decorated_names),
        ("verifiers handler signatures", "verifiers", _cache_handler_signatures),
        (
            "subprocess runtime folders made on first use",
            "verifiers",
            _make_runtime_folders_on_first_use,
        ),
    )
    untested = {library: verifiers_versions.untested(library) for _, library, _ in caches}
    applied = []
    for name, library, install in caches:
        if untested[library] is not None:
            continue
        if install():
            applied.append(name)
        else:
            logger.warning("cache of %s left out: its function is not where it was", name)
    for library, why in untested.items():
        if why is not None:
            left_out = ", ".join(name for name, of, _ in caches if of == library)
            logger.warning(
                "caches left out (%s): %s; they replace functions of the tested release "
                "only, so episodes are slower here, not different",
                left_out,
                why,
            )
    return applied


def _cache_default_factory_signatures() -> bool:
    """pydantic's `takes_validated_data_argument(default_factory)`, asked by every
    `FieldInfo.get_default` (`model_construct` of a model with a `default_factory`)."""
    try:
        from pydantic._internal import _fields
    except ImportError:
        return False
    original = getattr(_fields, "takes_validated_data_argument", None)
    if original is None or getattr(original, "_workbench_cached", False):
        return False
    _fields.takes_validated_data_argument = _cached_per_argument(original)
    return True


def _cache_decorated_names() -> bool:
    """verifiers' `discover_decorated(obj, attr)`: which of an object's methods carry a
    decorator's mark. The names are the class's (its MRO's functions); the methods are
    still bound and checked on the object each time, as verifiers does."""
    try:
        from verifiers.v1.utils import decorators
    except ImportError:
        return False
    original = getattr(decorators, "discover_decorated", None)
    if original is None or getattr(original, "_workbench_cached", False):
        return False
    names_of: dict[tuple[type, str], frozenset[str]] = {}

    def discover_decorated(obj: object, attr: str) -> list[Callable[..., Any]]:
        key = (type(obj), attr)
        names = names_of.get(key)
        if names is None:
            names = names_of[key] = frozenset(
                name
                for klass in type(obj).__mro__
                for name, fn in vars(klass).items()
                if callable(fn) and hasattr(fn, attr)
            )
        methods = [method for name in names if hasattr(method := getattr(obj, name), attr)]
        priority_attr = f"{attr}_priority"
        methods.sort(key=lambda m: (-getattr(m, priority_attr, 0), m.__name__))
        return methods

    discover_decorated._workbench_cached = True  # type: ignore[attr-defined]
    _replace_everywhere("discover_decorated", original, discover_decorated)
    return True


def _cache_handler_signatures() -> bool:
    """The `inspect.signature` that verifiers' `invoke(fn, available)` takes of each reward,
    metric or hook it calls (a bound method: a new object each call, so the key is its
    function)."""
    try:
        from verifiers.v1.utils import decorators
    except ImportError:
        return False
    if getattr(decorators, "inspect", None) is not inspect:
        return False
    decorators.inspect = _InspectWithCachedSignatures()
    return True


class _InspectWithCachedSignatures:
    """`inspect`, but `signature` answered once per function (bound or not)."""

    def __init__(self) -> None:
        self.signature = _cached_per_argument(inspect.signature, key=_function_and_binding)

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)


def _function_and_binding(fn: Any) -> tuple[Any, bool]:
    """A bound method is a new object each time: its function, and that it is bound."""
    bound = inspect.ismethod(fn)
    return (fn.__func__ if bound else fn, bound)


def _make_runtime_folders_on_first_use() -> bool:
    """verifiers' subprocess runtime makes a folder for every episode when the episode
    starts, and removes it (in a thread) when it ends: a `mkdir` and an `rmtree` on the
    episode's path, though an episode of `workbench-chat` runs no program in it. Here the
    folder is made when the runtime first runs a program or reads or writes a file in it
    (what the folder is for), and only one that was made is removed."""
    try:
        from verifiers.v1 import runtimes
        from verifiers.v1.runtimes import subprocess as subprocess_runtime
        from verifiers.v1.runtimes.subprocess import CACHE_DIR, SubprocessRuntime
    except ImportError:
        return False
    uses = ("run", "open_process", "run_background", "_read", "write")
    if runtimes.__dict__.get("SubprocessRuntime") is not SubprocessRuntime or not all(
        callable(getattr(SubprocessRuntime, name, None)) for name in uses
    ):
        return False

    class FolderOnFirstUse(SubprocessRuntime):
        async def start(self) -> None:
            # verifiers' own start, whole (the folder's name, `info.id`, whatever else it
            # sets), but the folder it makes under `CACHE_DIR` is only named: for this call
            # the module's `CACHE_DIR` is a root whose paths keep their `mkdir` for later.
            # The tested release's start does not await, so no other start sees that root.
            subprocess_runtime.CACHE_DIR = _HeldFolder(CACHE_DIR)
            try:
                await super().start()
            finally:
                subprocess_runtime.CACHE_DIR = CACHE_DIR
            held = self.workdir
            if isinstance(held, _HeldFolder):
                self.workdir = held.path
                # A view of this runtime (`with_env`, `with_user`) shares its attributes,
                # so the folder's state as well.
                self.workbench_mkdir = held.mkdir_arguments
                self.workbench_folder_made = held.mkdir_arguments is None

        def make_folder(self) -> None:
            """The folder, made as verifiers' start makes it (`parents=True`, and no
            `exist_ok`: a folder already there is refused, as at verifiers' start)."""
            arguments = self.__dict__.get("workbench_mkdir")
            if self.workdir is not None and arguments is not None:
                self.workbench_mkdir = None
                args, kwargs = arguments
                self.workdir.mkdir(*args, **kwargs)
                self.workbench_folder_made = True

        async def teardown(self) -> None:
            if not self.__dict__.get("workbench_folder_made", True):
                self.workdir = None  # never made: nothing to remove
            await super().teardown()

        def cleanup(self) -> None:
            if not self.__dict__.get("workbench_folder_made", True):
                self.workdir = None
            super().cleanup()

    def made_first(name: str) -> Any:
        method = getattr(SubprocessRuntime, name)

        async def use(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.make_folder()
            return await method(self, *args, **kwargs)

        use.__name__ = name
        return use

    for name in uses:
        setattr(FolderOnFirstUse, name, made_first(name))
    FolderOnFirstUse.__name__ = FolderOnFirstUse.__qualname__ = "SubprocessRuntime"
    # `make_runtime` looks the class up in the package's namespace on each call.
    runtimes.SubprocessRuntime = FolderOnFirstUse
    return True


class _HeldFolder:
    """A path that is named but not made: `/` names a folder inside it, `mkdir` keeps its
    arguments (`mkdir_arguments`) instead of making it, `str` is the path's."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self.mkdir_arguments: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def __truediv__(self, name: Any) -> _HeldFolder:
        return _HeldFolder(self.path / name)

    def mkdir(self, *args: Any, **kwargs: Any) -> None:
        self.mkdir_arguments = (args, kwargs)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


def _cached_per_argument(
    function: Callable[[Any], Any], key: Callable[[Any], Any] = lambda argument: argument
) -> Callable[[Any], Any]:
    """`function`, answered once per `key(argument)`; an unhashable key is asked each time."""
    answers: dict[Any, Any] = {}

    def cached(argument: Any) -> Any:
        known = key(argument)
        try:
            return answers[known]
        except KeyError:
            pass
        except TypeError:  # unhashable: asked each time
            return function(argument)
        answer = answers[known] = function(argument)
        return answer

    cached._workbench_cached = True  # type: ignore[attr-defined]
    return cached


def _replace_everywhere(name: str, original: Any, replacement: Any) -> None:
    """`replacement` for `original` in every verifiers module that imported it by name."""
    import sys

    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("verifiers") and getattr(module, name, None) is original:
            setattr(module, name, replacement)
