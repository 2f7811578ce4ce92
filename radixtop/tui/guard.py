"""`guarded`: an exception in one of the app's handlers becomes a notice in the log pane, not a dead app.

The app and its mixins (tui/search.py, tui/servers.py) decorate their handlers with it; the notice
is the app's `report_failure`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def guarded(what: str) -> Callable:
    """Turn an exception in a handler into a notice in the log pane instead of a dead app."""

    def decorate(method: Callable) -> Callable:
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def async_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await method(self, *args, **kwargs)
                except Exception as exc:
                    self.report_failure(what, exc)
                    return None

            return async_wrapper

        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                self.report_failure(what, exc)
                return None

        return wrapper

    return decorate
