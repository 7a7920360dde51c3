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

Each cache replaces one library function only if that function is where this release keeps
it; otherwise it is left alone (slower, never wrong), and `apply` says which were put in
place.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def apply() -> list[str]:
    """Put each cache in place; returns the names of those that were."""
    applied = []
    for name, install in (
        ("pydantic default factories", _cache_default_factory_signatures),
        ("verifiers decorated methods", _cache_decorated_names),
        ("verifiers handler signatures", _cache_handler_signatures),
        ("subprocess runtime folders made on first use", _make_runtime_folders_on_first_use),
    ):
        if install():
            applied.append(name)
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
            # As verifiers names it; `info.id` too. A view of this runtime (`with_env`,
            # `with_user`) shares its attributes, so the folder's state as well.
            self.workdir = CACHE_DIR / "runtimes" / "subprocess" / self.name
            self.info.id = str(self.workdir)
            self.workbench_folder_made = False

        def make_folder(self) -> None:
            if self.workdir is not None and not self.__dict__.get("workbench_folder_made", True):
                self.workdir.mkdir(parents=True, exist_ok=True)
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
