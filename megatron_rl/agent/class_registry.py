"""A registry of classes by name, strict at both ends (STYLE.md §1): registering a name twice raises, so does a
class that is not a subclass of the registry's base; an unknown name raises listing the sorted valid names and
how to add one. The agent loops (``loop.py``) and the interactions (``interactions.py``) are two of them."""
from __future__ import annotations


class ClassRegistry:
    """Classes of ``base`` by name; ``what`` names them in errors, ``how`` says how to register one."""

    def __init__(self, what: str, base: type, how: str):
        self.what, self.base, self.how, self._classes = what, base, how, {}

    def register(self, name: str):
        """Class decorator: register a ``base`` subclass under ``name`` (its ``name`` attribute is set)."""
        def deco(cls):
            if name in self._classes:
                raise ValueError(f"{self.what} {name!r} registered twice")
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"registering {self.what} {name!r}: expected a {self.base.__name__} subclass, "
                                f"got {cls!r}")
            cls.name = name
            self._classes[name] = cls
            return cls
        return deco

    def names(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: str) -> type:
        """The class of ``name``; ``KeyError`` with the valid names and how to add one otherwise."""
        try:
            return self._classes[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; valid: {self.names()}; {self.how}") from None
