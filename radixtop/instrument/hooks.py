"""Counters and an event feed from wrapping a radix cache's inc_lock_ref, dec_lock_ref and evict
(and evict_for_alloc where the cache has it).

Runs inside the host's scheduler: standard library only, constant cost per call (dec_lock_ref
also reads the unlocked node's lock_ref once), and the host never sees an exception from us: the
host's own exceptions pass through unchanged (after being counted); ours are caught, counted,
logged, turned into an event, and after `max_errors` of them the hooks disable themselves and put
the original methods back.

Three ways in, one set of wrappers (the _wrap_* factories below):
- install(cls) wraps the class's methods: every instance counts into these hooks;
- install(cache) counts one instance: the class that defines each method gets a dispatching
  wrapper that finds the instance's hooks in a table (one dict lookup per call; other instances
  pass straight through). Nothing is written into the instance: on CPython 3.11 an instance-dict
  entry, or a __class__ swap, slows every `self.x` in the host's own methods. Dispatching
  wrappers are shared and reference-counted, so several caches (the simulator's ranks, in one
  process) each count into their own hooks;
- around_hooks() hands out AROUND hooks, `fn(original, cache, *args, **kwargs)`, the shape SGLang's
  HookRegistry uses for "module.Class.method" targets, for a plugin that patches through it.
uninstall() puts back what install() changed. Counters assume one thread drives a given cache, as
SGLang's scheduler does.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from radixtop.schema import MAX_EVENTS_PER_PAGE, Counters, Event

log = logging.getLogger("radixtop.instrument")

HOOKED_METHODS = ("inc_lock_ref", "dec_lock_ref", "evict")
# Hooked as well where the cache has it: SGLang's allocators evict through evict_for_alloc, which
# UnifiedRadixCache implements without calling evict (RadixCache's forwards to evict, counted once).
OPTIONAL_METHODS = ("evict_for_alloc",)
_ALL_METHODS = HOOKED_METHODS + OPTIONAL_METHODS
_MISSING = object()
_NO = object()  # "argument not given", for the wrappers' fast paths
_PATH_STEPS = range(1 << 20)  # a parent chain longer than this is a cycle, not a tree
_MARK = "__radixtop_route__"  # set on every wrapper: the _Route it reads its hooks from
_new_event = tuple.__new__  # builds an Event in C


class EventRing:
    """A bounded ring of events with strictly increasing seq numbers (1, 2, ...).

    Written by the scheduler thread, read by the HTTP thread; one lock guards both.
    """

    def __init__(self, capacity: int = 4096, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError(f"event ring capacity must be >= 1, got {capacity}")
        self._ring: deque[Event] = deque(maxlen=capacity)
        self._capacity = capacity
        self._lock = threading.Lock()
        self._clock = clock
        self._latest = 0
        self.dropped_total = 0

    @property
    def latest_seq(self) -> int:
        return self._latest

    def push(
        self,
        kind: str,
        *,
        node_id: int | None = None,
        lock_ref: int | None = None,
        tokens: int | None = None,
        requested: int | None = None,
        message: str = "",
    ) -> None:
        """Callers pass plain ints (or None) and a short message; this runs on the scheduler thread."""
        self.append(kind, node_id, lock_ref, tokens, requested, message[:500])

    def append(
        self, kind: str, node_id: int | None, lock_ref: int | None, tokens: int | None, requested: int | None,
        message: str,
    ) -> None:
        """push() with positional arguments and no checks: the hooks' hot path (one per evict)."""
        now = self._clock()
        lock = self._lock
        lock.acquire()
        self._latest = seq = self._latest + 1
        if seq > self._capacity:
            self.dropped_total += 1
        self._ring.append(_new_event(Event, (seq, now, kind, node_id, lock_ref, tokens, requested, message)))
        lock.release()

    def read(self, since: int, limit: int = 1000) -> tuple[tuple[Event, ...], int, int, bool]:
        """(events with seq > since, oldest first, at most limit; latest seq; dropped; more)."""
        limit = max(1, min(limit, MAX_EVENTS_PER_PAGE))
        with self._lock:
            latest = self._latest
            if not self._ring or since >= latest:
                return (), latest, 0, False
            oldest = self._ring[0].seq
            dropped = max(0, oldest - max(since, 0) - 1)
            start = max(since + 1, oldest) - oldest  # seqs in the ring are consecutive
            end = min(start + limit, len(self._ring))
            events = tuple(self._ring[i] for i in range(start, end))
            return events, latest, dropped, end < len(self._ring)


def _plain_int(value: Any) -> int | None:
    return value if type(value) is int else None


def _node_id(node: Any) -> int | None:
    return _plain_int(getattr(node, "id", None))


def _node_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # args exclude the cache: the node is the first of them.
    return args[0] if args else kwargs.get("node")


class _Route:
    """Where a wrapper finds the hooks for a cache: table[id(cache)], else `default`."""

    __slots__ = ("default", "table")

    def __init__(self, table: dict[int, CacheHooks], default: CacheHooks | None) -> None:
        self.table = table
        self.default = default


class _Dispatch:
    """One dispatching wrapper on the class that defines a method, shared by instance installs."""

    __slots__ = ("name", "owner", "raw", "users", "wrapper")

    def __init__(self, owner: type, name: str, raw: Any, wrapper: Any) -> None:
        self.owner, self.name, self.raw, self.wrapper, self.users = owner, name, raw, wrapper, 0


# Instance installs: id(cache) -> hooks. An entry leaves when the cache is uninstalled or
# collected, before its id can be reused.
_INSTANCE_HOOKS: dict[int, CacheHooks] = {}
_DISPATCH_ROUTE = _Route(_INSTANCE_HOOKS, None)
_DISPATCHES: dict[tuple[type, str], _Dispatch] = {}
_REGISTRY_LOCK = threading.RLock()


class CacheHooks:
    """Counters + events for one cache (one rank). Install on that cache, or on its class."""

    def __init__(self, *, max_errors: int = 20, event_capacity: int = 4096, events: EventRing | None = None) -> None:
        self.events = events or EventRing(event_capacity)
        self.max_errors = max(1, max_errors)
        self.lock_ops = 0
        self.unlock_ops = 0
        self.lock_failures = 0
        self.unlock_failures = 0
        self.negative_lock_ref = 0
        self.evict_calls = 0
        self.evictions = 0
        self.evicted_tokens = 0
        self.evict_short_locked = 0
        self.evict_failures = 0
        self.instrument_errors = 0
        self.disabled_reason = ""
        # Called as on_host_failure(kind, message, node) after the cache raised (flight.py records
        # it); node: the failing lock or unlock's node as the cache's API names it (a TreeNode's
        # id, a NodeId), None for evict or where it is not a plain int.
        self.on_host_failure: Callable[[str, str, int | None], Any] | None = None
        self._disabled = False
        self._external = False  # AROUND hooks handed to someone else's registry
        self._walk_paths = True  # off once nodes turn out not to be TreeNodes (e.g. NodeIds)
        self._evicting = False  # inside a counted evict: a nested one (evict_for_alloc -> evict) is not counted again
        self._evict_reports_freed = False  # SGLang >= 0.5 returns EvictResult: no need to read sizes first
        self._lock = threading.RLock()
        self._installed: dict[int, Callable[[], None]] = {}  # id(target) -> how to undo it
        self._own_route = _Route({}, self)  # class installs and AROUND hooks: always these hooks
        self._around_cache: dict[tuple[str, Any], Callable[..., Any]] = {}
        self._arounds: dict[str, Callable[..., Any]] = {
            "inc_lock_ref": self.around_inc_lock_ref,
            "dec_lock_ref": self.around_dec_lock_ref,
            "evict": self.around_evict,
        }

    # -- state ----------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self._disabled:
            return "disabled"
        return "active" if (self._installed or self._external) else "off"

    def counters(self) -> Counters:
        return Counters(
            lock_ops=self.lock_ops,
            unlock_ops=self.unlock_ops,
            lock_failures=self.lock_failures,
            unlock_failures=self.unlock_failures,
            negative_lock_ref=self.negative_lock_ref,
            evict_calls=self.evict_calls,
            evictions=self.evictions,
            evicted_tokens=self.evicted_tokens,
            evict_short_locked=self.evict_short_locked,
            evict_failures=self.evict_failures,
            instrument_errors=self.instrument_errors,
            events_dropped=self.events.dropped_total,
        )

    def around_hooks(self) -> dict[str, Callable[..., Any]]:
        """{method name: AROUND hook} for a registry that patches "module.Class.method" itself.
        Disabling then makes them pass straight through (a registry cannot be asked to unpatch)."""
        self._external = True
        return dict(self._arounds)

    # -- the AROUND hooks (for a registry that patches the class itself) -----------------------

    def around_inc_lock_ref(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._wrapped("inc_lock_ref", original)(*args, **kwargs)

    def around_dec_lock_ref(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._wrapped("dec_lock_ref", original)(*args, **kwargs)

    def around_evict(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._wrapped("evict", original)(*args, **kwargs)

    def _wrapped(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        key = (name, original)
        wrapper = self._around_cache.get(key)
        if wrapper is None:
            wrapper = self._around_cache[key] = _FACTORIES[name](self._own_route, original)
        return wrapper

    # -- bookkeeping (constant cost, except the path re-read after an unlock) -----------------

    def _negative(self, node: Any) -> None:
        """dec_lock_ref left `node` (the deepest such node on the path) below zero."""
        first = node
        count = 0
        for _ in _PATH_STEPS:
            if node is None:
                break
            if node.lock_ref < 0:
                count += 1
            node = node.parent
        self.negative_lock_ref += 1
        self.events.push(
            "negative_lock_ref",
            node_id=_node_id(first),
            lock_ref=_plain_int(first.lock_ref),
            message=f"dec_lock_ref left {count} node(s) on the unlocked path below zero (double unlock?)",
        )

    def _evicted(self, cache: Any, freed: int, requested: int | None) -> None:
        # Events carry counts >= 0 (the schema refuses others), whatever a strange cache reports.
        if requested is not None and requested < 0:
            requested = None
        if freed > 0:
            self.evictions += 1
            self.evicted_tokens += freed
            self.events.append("evict", None, None, freed, requested, "")
        elif freed < 0:
            freed = 0
        if requested is not None and freed < requested:
            protected = cache.protected_size()
            if type(protected) is int and protected > 0:
                self.evict_short_locked += 1
                self.events.push(
                    "evict_short",
                    tokens=freed,
                    requested=requested,
                    message=f"evict freed {freed} of {requested} tokens while {protected} tokens were locked",
                )

    def _host_failure(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException) -> None:
        try:
            if kind == "lock_failure":
                self.lock_failures += 1
            elif kind == "unlock_failure":
                self.unlock_failures += 1
            else:
                self.evict_failures += 1
            node = _node_arg(args, kwargs)
            self.events.push(
                kind,
                node_id=_node_id(node),
                lock_ref=_plain_int(getattr(node, "lock_ref", None)),
                message=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500],
            )
            if self.on_host_failure is not None:
                named = node if type(node) is int else _node_id(node)  # a NodeId, or a TreeNode's id
                self.on_host_failure(kind, f"{type(exc).__name__}: {exc}", named)
        except Exception as own:
            self._own_error(kind, own)

    def _own_error(self, where: str, exc: BaseException) -> None:
        """Count our own failure; never raise. Too many and the hooks take themselves out."""
        try:
            self.instrument_errors += 1
            n = self.instrument_errors
            if n <= 3 or n % 100 == 0:
                log.warning("radixtop hook error #%d in %s: %s: %s", n, where, type(exc).__name__, exc)
            self.events.push("instrument_error", message=f"{where}: {type(exc).__name__}: {exc}")
            if n >= self.max_errors and not self._disabled:
                self.disable(f"{n} instrument errors (last in {where}: {type(exc).__name__})")
        except Exception:
            pass

    def disable(self, reason: str) -> None:
        """Stop counting and put the original methods back. Idempotent; never raises."""
        try:
            with self._lock:
                if self._disabled:
                    return
                self._disabled = True
                self.disabled_reason = reason
            log.warning("radixtop hooks disabled: %s; original cache methods restored", reason)
            self.events.push("hooks_disabled", message=reason)
            self.uninstall()
        except Exception:
            pass

    # -- install / uninstall -----------------------------------------------------------------

    def install(self, target: Any) -> bool:
        """Count calls on a class (every instance) or on one instance. Idempotent.

        Returns True when the target is hooked by this object. Methods that are missing, or that
        radixtop hooks on a class already count, are left alone so nothing is counted twice."""
        try:
            with _REGISTRY_LOCK, self._lock:
                if self._disabled:
                    log.warning("radixtop hooks are disabled (%s); not installing", self.disabled_reason)
                    return False
                if id(target) in self._installed:
                    return True
                undo = self._install_class(target) if isinstance(target, type) else self._install_instance(target)
                if undo is not None:
                    self._installed[id(target)] = undo
                return undo is not None
        except Exception as exc:
            log.warning("radixtop hooks not installed on %s: %s: %s", _describe(target), type(exc).__name__, exc)
            return False

    def _install_class(self, cls: type) -> Callable[[], None] | None:
        done: list[tuple[str, Any, Any]] = []
        for name in _methods_for(cls):
            current = getattr(cls, name, None)
            if not callable(current) or getattr(current, _MARK, None) is not None:
                continue  # missing, or hooked already (by class or by instance installs)
            raw = cls.__dict__.get(name, _MISSING)
            if isinstance(raw, (staticmethod, classmethod)):
                continue
            wrapper = _FACTORIES[name](self._own_route, current)
            functools.update_wrapper(wrapper, current)
            setattr(wrapper, _MARK, self._own_route)
            setattr(cls, name, wrapper)
            done.append((name, raw, wrapper))
        if not done:
            return None

        def undo() -> None:
            for name, raw, wrapper in done:
                if cls.__dict__.get(name) is not wrapper:
                    log.warning("radixtop: %s.%s was re-patched by someone else; leaving it", _describe(cls), name)
                elif raw is _MISSING:
                    delattr(cls, name)  # inherited again
                else:
                    setattr(cls, name, raw)

        return undo

    def _install_instance(self, cache: Any) -> Callable[[], None] | None:
        if _INSTANCE_HOOKS.get(id(cache), self) is not self:
            log.warning("radixtop: this %s is already hooked by other CacheHooks; not installing", _describe(cache))
            return None
        cls = type(cache)
        used: list[_Dispatch] = []
        own_done: list[tuple[str, Any, Any]] = []
        own: Any = None
        for name in _methods_for(cls):
            current = getattr(cls, name, None)
            bound = getattr(cache, name, None)
            if bound is not None and (
                getattr(bound, "__self__", None) is not cache or getattr(bound, "__func__", None) is not current
            ):
                # The instance overrides the method in its own __dict__: only there can it be
                # wrapped. (Only then is __dict__ read: on CPython 3.11 reading it turns the
                # instance's inline attribute values into a plain dict, slowing every self.x.)
                own = cache.__dict__
                if name in own and getattr(getattr(bound, "__func__", bound), _MARK, None) is None:
                    function = _FACTORIES[name](self._own_route, _drop_self(bound))
                    setattr(function, _MARK, self._own_route)
                    own[name] = method = types.MethodType(function, cache)
                    own_done.append((name, bound, method))
                continue
            if not callable(current):
                continue
            route = getattr(current, _MARK, None)
            if route is not None and route is not _DISPATCH_ROUTE:
                continue  # hooks on a class already count this instance
            owner = next(k for k in cls.__mro__ if name in k.__dict__)
            dispatch = _DISPATCHES.get((owner, name))
            if dispatch is None:
                raw = owner.__dict__[name]
                if isinstance(raw, (staticmethod, classmethod)):
                    continue
                wrapper = _FACTORIES[name](_DISPATCH_ROUTE, raw)
                functools.update_wrapper(wrapper, raw)
                setattr(wrapper, _MARK, _DISPATCH_ROUTE)
                setattr(owner, name, wrapper)
                dispatch = _DISPATCHES[(owner, name)] = _Dispatch(owner, name, raw, wrapper)
            dispatch.users += 1
            used.append(dispatch)
        if not used and not own_done:
            return None
        key = id(cache)
        if used:
            _INSTANCE_HOOKS[key] = self

        def undo() -> None:
            if _INSTANCE_HOOKS.get(key) is self:
                del _INSTANCE_HOOKS[key]
            for dispatch in used:
                dispatch.users -= 1
                if dispatch.users > 0:
                    continue
                _DISPATCHES.pop((dispatch.owner, dispatch.name), None)
                if dispatch.owner.__dict__.get(dispatch.name) is dispatch.wrapper:
                    setattr(dispatch.owner, dispatch.name, dispatch.raw)
                else:
                    log.warning(
                        "radixtop: %s.%s was re-patched by someone else; leaving it",
                        dispatch.owner.__qualname__, dispatch.name,
                    )
            for name, raw, wrapper in own_done:
                if own.get(name) is wrapper:
                    own[name] = raw

        # A cache that goes away unregisters itself (the callback runs before its id can be
        # reused); one that cannot be weakly referenced is kept alive while registered instead.
        try:
            undo.keep = weakref.ref(cache, lambda _ref: self._forget(key))  # type: ignore[attr-defined]
        except TypeError:
            undo.keep = cache  # type: ignore[attr-defined]
        return undo

    def _forget(self, key: int) -> None:
        try:
            with _REGISTRY_LOCK, self._lock:
                undo = self._installed.pop(key, None)
                if undo is not None:
                    undo()
        except Exception:
            pass

    def uninstall(self) -> None:
        """Put back everything install() changed. Idempotent; never raises."""
        with _REGISTRY_LOCK, self._lock:
            undos = list(self._installed.values())
            self._installed.clear()
            for undo in undos:
                try:
                    undo()
                except Exception as exc:
                    log.warning("radixtop: could not restore a hooked method: %s: %s", type(exc).__name__, exc)


def _owner(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in k.__dict__), None)


def _methods_for(cls: type) -> tuple[str, ...]:
    """The methods to hook on cls. evict_for_alloc only where the class defines it at or below its
    evict: an inherited base version (SGLang's BasePrefixCache forwards to evict) is counted
    through evict, and a second wrapper would only cost time."""
    efa, evict = _owner(cls, "evict_for_alloc"), _owner(cls, "evict")
    if efa is not None and evict is not None and efa is not evict and issubclass(evict, efa):
        return HOOKED_METHODS
    return _ALL_METHODS


def _drop_self(bound: Callable[..., Any]) -> Callable[..., Any]:
    def original(_cache: Any, *args: Any, **kwargs: Any) -> Any:
        return bound(*args, **kwargs)

    return original


# One wrapper per method around the original: a single extra frame per call, a plain call for the
# usual arguments (forwarding *args/**kwargs costs twice as much). Each takes the cache first, like
# the method it replaces, and asks its route for the cache's hooks (None: not counted).


def _positional_names(function: Any) -> tuple[str, ...] | None:
    """The parameters after self of a plain Python function that takes nothing but positional-or-
    keyword parameters (no *args, **kwargs or keyword-only ones); None for anything else. Such a
    method gets a wrapper of the same shape, which CPython calls as cheaply as the method."""
    code = getattr(function, "__code__", None)
    if not isinstance(function, types.FunctionType) or code is None:
        return None
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        return None
    return code.co_varnames[1 : code.co_argcount]


def _wrap_inc_lock_ref(route: _Route, original: Callable[..., Any]) -> Callable[..., Any]:
    lookup, default = route.table.get, route.default

    if _positional_names(original) == ("node",) and not original.__defaults__:
        # RadixCache's shape, inc_lock_ref(self, node): the same shape here.
        # A class install (or an AROUND hook) counts into its own hooks, always: no table lookup
        # (`own or ...` is one truth test; an instance install's route has a table and no own).
        own = route.default if not route.table else None

        def inc_lock_ref_exact(cache: Any, node: Any) -> Any:
            hooks = own or lookup(id(cache), default)
            if hooks is None or hooks._disabled:
                return original(cache, node)
            hooks.lock_ops += 1
            try:
                return original(cache, node)
            except Exception as exc:  # the host's failure: count it, then let it propagate unchanged
                hooks._host_failure("lock_failure", (node,), {}, exc)
                raise

        return inc_lock_ref_exact

    def generic(hooks: CacheHooks, cache: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        hooks.lock_ops += 1
        try:
            return original(cache, *args, **kwargs)
        except Exception as exc:  # the host's failure: count it, then let it propagate unchanged
            hooks._host_failure("lock_failure", args, kwargs, exc)
            raise

    def inc_lock_ref(cache: Any, node: Any = _NO, *args: Any, **kwargs: Any) -> Any:
        hooks = lookup(id(cache), default)
        if hooks is None or hooks._disabled:
            return original(cache, *args, **kwargs) if node is _NO else original(cache, node, *args, **kwargs)
        if node is _NO or args or kwargs:
            return generic(hooks, cache, args if node is _NO else (node, *args), kwargs)
        hooks.lock_ops += 1
        try:
            return original(cache, node)
        except Exception as exc:
            hooks._host_failure("lock_failure", (node,), {}, exc)
            raise

    return inc_lock_ref


def _check_node(hooks: CacheHooks, node: Any) -> None:
    """After dec_lock_ref(node): is node's lock_ref below zero? One read, whatever the path length:
    every lock and unlock walks the node's whole path, so its ancestors hold at least its count
    and the node itself is the first to go negative (a double unlock)."""
    try:
        if node is not None and node.lock_ref < 0:
            hooks._negative(node)
    except AttributeError:
        hooks._walk_paths = False  # not SGLang TreeNodes (e.g. NodeIds): nothing to read
    except Exception as exc:
        hooks._own_error("dec_lock_ref", exc)


def _wrap_dec_lock_ref(route: _Route, original: Callable[..., Any]) -> Callable[..., Any]:
    lookup, default = route.table.get, route.default

    if _positional_names(original) == ("node", "params") and len(original.__defaults__ or ()) == 1:
        # RadixCache's shape, dec_lock_ref(self, node, params=None): the same shape here.
        # A class install (or an AROUND hook) counts into its own hooks, always: no table lookup
        # (`own or ...` is one truth test; an instance install's route has a table and no own).
        own = route.default if not route.table else None

        def dec_lock_ref_exact(cache: Any, node: Any, params: Any = _NO) -> Any:
            hooks = own or lookup(id(cache), default)
            if hooks is None or hooks._disabled:
                return original(cache, node) if params is _NO else original(cache, node, params)
            hooks.unlock_ops += 1
            try:
                result = original(cache, node) if params is _NO else original(cache, node, params)
            except Exception as exc:
                hooks._host_failure("unlock_failure", (node,), {}, exc)
                raise
            if hooks._walk_paths:
                try:
                    if node.lock_ref < 0:  # the common case inline: it did not go below zero
                        hooks._negative(node)
                except Exception:
                    _check_node(hooks, node)
            return result

        return dec_lock_ref_exact

    def generic(hooks: CacheHooks, cache: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        hooks.unlock_ops += 1
        try:
            result = original(cache, *args, **kwargs)
        except Exception as exc:
            hooks._host_failure("unlock_failure", args, kwargs, exc)
            raise
        if hooks._walk_paths:
            _check_node(hooks, _node_arg(args, kwargs))
        return result

    def dec_lock_ref(cache: Any, node: Any = _NO, extra: Any = _NO, *args: Any, **kwargs: Any) -> Any:
        hooks = lookup(id(cache), default)
        if hooks is None or hooks._disabled or node is _NO or args or kwargs:
            head = () if node is _NO else (node,) if extra is _NO else (node, extra)
            if hooks is None or hooks._disabled:
                return original(cache, *head, *args, **kwargs)
            return generic(hooks, cache, (*head, *args), kwargs)
        # Fast path: dec_lock_ref(node) or dec_lock_ref(node, params).
        hooks.unlock_ops += 1
        try:
            result = original(cache, node) if extra is _NO else original(cache, node, extra)
        except Exception as exc:
            hooks._host_failure("unlock_failure", (node,), {}, exc)
            raise
        if hooks._walk_paths:
            try:
                if node.lock_ref < 0:  # the common case inline: it did not go below zero
                    hooks._negative(node)
            except Exception:
                _check_node(hooks, node)  # the slow path sorts out what went wrong, once
        return result

    return dec_lock_ref


def _wrap_evict(route: _Route, original: Callable[..., Any], for_alloc: bool = False) -> Callable[..., Any]:
    lookup, default = route.table.get, route.default
    general = _wrap_evict_general(route, original, for_alloc)
    if for_alloc or _positional_names(original) != ("params",) or original.__defaults__:
        return general

    def evict_exact(cache: Any, params: Any) -> Any:
        """SGLang >= 0.5's evict(self, params) -> EvictResult: the same shape, the common case
        straight through (the general wrapper sorts out the first call and anything odd)."""
        hooks = lookup(id(cache), default)
        if hooks is None or not hooks._evict_reports_freed or hooks._evicting or hooks._disabled:
            return general(cache, params)
        hooks.evict_calls += 1
        hooks._evicting = True
        try:
            result = original(cache, params)
        except Exception as exc:  # the host's failure: count it, then let it propagate unchanged
            hooks._host_failure("evict_failure", (), {}, exc)
            raise
        finally:
            hooks._evicting = False
        try:
            freed = getattr(result, "num_tokens_evicted", None)
            requested = params if type(params) is int else getattr(params, "num_tokens", None)
            if type(freed) is int and freed > 0 and (type(requested) is not int or freed >= requested):
                hooks.evictions += 1  # the common case inline: it freed what was asked
                hooks.evicted_tokens += freed
                hooks.events.append(
                    "evict", None, None, freed, requested if type(requested) is int and requested >= 0 else None, ""
                )
            elif type(freed) is int:
                hooks._evicted(cache, freed, requested if type(requested) is int else None)
        except Exception as exc:
            hooks._own_error("evict (after)", exc)
        return result

    return evict_exact


def _wrap_evict_general(route: _Route, original: Callable[..., Any], for_alloc: bool = False) -> Callable[..., Any]:
    lookup, default = route.table.get, route.default

    def evict(cache: Any, *args: Any, **kwargs: Any) -> Any:
        hooks = lookup(id(cache), default)
        if hooks is None or hooks._disabled or hooks._evicting:
            return original(cache, *args, **kwargs)
        hooks.evict_calls += 1
        before = None
        if not hooks._evict_reports_freed:  # older SGLang: freed = evictable before - after
            try:
                before = cache.evictable_size()
            except Exception as exc:
                hooks._own_error("evict (before)", exc)
        hooks._evicting = True
        try:
            result = original(cache, *args, **kwargs)
        except Exception as exc:  # the host's failure: count it, then let it propagate unchanged
            hooks._host_failure("evict_failure", (), {}, exc)
            raise
        finally:
            hooks._evicting = False
        try:
            # SGLang >= 0.5 returns EvictResult(num_tokens_evicted); older releases return None.
            freed = getattr(result, "num_tokens_evicted", None)
            after = None
            if type(freed) is int:
                hooks._evict_reports_freed = True
            else:
                after = cache.evictable_size()
                freed = before - after if type(before) is int and type(after) is int else None
            if freed is not None:
                # SGLang >= 0.5: evict(EvictParams(num_tokens=...)); older: evict(num_tokens, callback).
                arg = args[0] if args else kwargs.get("params", kwargs.get("num_tokens"))
                requested = arg if type(arg) is int else getattr(arg, "num_tokens", None)
                if type(requested) is not int:
                    requested = None
                elif for_alloc and freed < requested:
                    # evict_for_alloc may stop once the allocation fits: short only if nothing
                    # evictable was left.
                    if after is None:
                        after = cache.evictable_size()
                    if type(after) is not int or after > 0:
                        requested = None
                hooks._evicted(cache, freed, requested)
        except Exception as exc:
            hooks._own_error("evict (after)", exc)
        return result

    return evict


def _wrap_evict_for_alloc(route: _Route, original: Callable[..., Any]) -> Callable[..., Any]:
    return _wrap_evict(route, original, for_alloc=True)


_FACTORIES: dict[str, Callable[[_Route, Callable[..., Any]], Callable[..., Any]]] = {
    "inc_lock_ref": _wrap_inc_lock_ref,
    "dec_lock_ref": _wrap_dec_lock_ref,
    "evict": _wrap_evict,
    "evict_for_alloc": _wrap_evict_for_alloc,
}


def _describe(target: Any) -> str:
    return target.__qualname__ if isinstance(target, type) else f"{type(target).__name__} instance"
