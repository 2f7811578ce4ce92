"""An import-only stand-in for torchvision in the CPU test environment (see .ci/sglang-tests).

PyPI's torchvision cannot load beside the CPU build of torch (its C++ operators are built for
another torch), yet SGLang's multimodal modules import it at module level on the way to the
radix cache. Installed as site-packages/torchvision/__init__.py, this module lets every
`torchvision.*` import succeed and hands out inert placeholder classes; calling into them
raises, so nothing can silently depend on it. It has no dist-info, so transformers reports
torchvision as unavailable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+radixtop.stub"


class _StubMeta(type):
    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item: object) -> type:
        return cls

    def __or__(cls, other: object) -> object:  # used in type annotations evaluated at import
        return cls

    __ror__ = __or__


class _Stub(metaclass=_StubMeta):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{type(self).__qualname__} comes from radixtop's torchvision stub and cannot run")


def _placeholder(name: str) -> type:
    return _StubMeta(name.rsplit(".", 1)[-1], (_Stub,), {"__qualname__": name, "__module__": "torchvision"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        return _placeholder(full)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so deeper imports reach this finder too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        parent, _, child = module.__name__.rpartition(".")
        setattr(sys.modules[parent], child, module)


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _StubModule
