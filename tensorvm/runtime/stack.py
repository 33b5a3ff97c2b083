"""Deep Python recursion without races on the process-wide settings it needs.

Python's recursion limit and the stack size of new threads are settings of the whole process. Two
threads that each raise the limit, run, and put back the value they saw can leave it raised for good, or
lower it under the other while that one is deeper than the new value; CPython then aborts the process
at its next call ("Fatal Python error: _Py_CheckRecursiveCall: Cannot recover from stack overflow").

The invariant kept here: the limit is lowered only when no thread may be deeper than the value it
returns to. Every thread that may recurse deeply is a *user* (``recursion_users``), counted under one
lock; the first user records the limit, users that need more raise it, and only the last one to leave
restores the recorded value. Users that do not raise the limit (compiled-mode calls trying the
ordinary limit first) are counted too, since a limit raised by another thread lets them go deeper.

``run_on_deep_stack`` runs a call on a new thread with a large stack, as a user holding a high limit;
thread stack sizes are set and the thread started under a lock. An interrupt (``KeyboardInterrupt``) or
other exception in the waiting caller is forwarded to the worker, which unwinds before the caller
raises, so no worker outlives its call. ``caller_ident`` names the thread a call acts for (the waiting
caller, inside the worker), so per-object ownership checks see a callback on the worker as a nested call.
``pause_gc``/``resume_gc`` pause the cyclic collector for deep VM stacks, counted the same way.

The bookkeeping is written so that an interrupt landing anywhere in it leaves things consistent: users
and pausers are tokens in sets (leaving is idempotent and retried), and each "raised" or "owed" flag is
set before the change it records.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import threading

__all__ = ["recursion_users", "enter", "leave", "USERS", "limit_raised", "run_on_deep_stack", "start_thread", "caller_ident",
           "pause_gc", "resume_gc", "GC_PAUSERS"]

_LOCK = threading.Lock()
_users: set = set()  # a token per current user
USERS = _users
_restore = 0     # the limit when the first current user came (put back when the last one leaves)
_raised_to = 0   # the limit set by a user (0: none set since the first came)
_STACK_LOCK = threading.Lock()


class _Acting(threading.local):
    ident = None  # set in deep-stack workers: the ident of the thread they run a call for


_acting = _Acting()


DEEP_RECURSION_LIMIT = 250_000  # what the interpreter and the VM raise Python's limit to while recursing


@contextlib.contextmanager
def recursion_users(limit: int = 0):
    """Count this thread as one that may recurse deeply for the duration, with a limit of at least
    ``limit`` (0: the limit in force)."""
    token = object()
    try:  # (entered inside: an interrupt in enter still leaves)
        enter(token, limit)
        yield
    finally:
        USERS.discard(token)  # see leave
        leave(token)


def leave(token) -> None:
    """The end of ``enter(token, ...)`` (also when ``enter`` was interrupted). Callers first run
    ``USERS.discard(token)`` in their ``finally``: a C call, done before any pending interrupt can be
    raised (one can be raised on entering any Python function, this one included); this then restores
    the limit when no user is left (or the next ``enter`` does, when an interrupt stopped it)."""
    _surely(_leave, token)


def enter(token, limit: int = 0) -> None:
    """Count the caller as a recursion user until ``leave(token)`` (``recursion_users`` without a generator,
    for hot paths; call it inside the ``try`` whose ``finally`` leaves)."""
    global _restore, _raised_to
    with _LOCK:
        if not _users:
            if _raised_to and sys.getrecursionlimit() == _raised_to:
                sys.setrecursionlimit(_restore)  # the last user was interrupted before restoring it
            _restore, _raised_to = sys.getrecursionlimit(), 0
        _users.add(token)
        if limit > sys.getrecursionlimit():
            _raised_to = limit  # first: an interrupt between the two lines must not hide the raise
            sys.setrecursionlimit(limit)


def _leave(token) -> None:
    """(Idempotent, so that it can be retried when an exception interrupts it.)"""
    with _LOCK:
        _users.discard(token)
        # (left alone when someone else changed it meanwhile)
        if not _users and _raised_to and sys.getrecursionlimit() == _raised_to:
            sys.setrecursionlimit(_restore)


def limit_raised() -> bool:
    """Whether a user holds the recursion limit above the value it returns to."""
    return bool(_users) and _raised_to > 0


def start_thread(target, stack_bytes: int, name: str) -> threading.Thread:
    """A started thread running ``target`` with a stack of ``stack_bytes``."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    _start(thread, stack_bytes)
    return thread


def _start(thread: threading.Thread, stack_bytes: int) -> None:
    """Start ``thread`` with a ``stack_bytes`` stack (the process-wide size for new threads is set, used
    and put back under a lock)."""
    with _STACK_LOCK:
        old = threading.stack_size(stack_bytes)
        try:
            thread.start()
        finally:
            threading.stack_size(old)


def caller_ident() -> int:
    """The ident of the thread this code acts for: the waiting caller inside a deep-stack worker."""
    return _acting.ident or threading.get_ident()


def run_on_deep_stack(fn, args, stack_bytes: int, limit: int):
    """``fn(*args)`` on a thread with a ``stack_bytes`` stack and a recursion limit of at least ``limit``;
    returns its value or raises its exception here. The worker never outlives the call: an exception in
    the caller while it waits (an interrupt) is raised in the worker too, and the caller waits for it.

    The wait is on a flag the worker sets last (polled, with an event to wake up early), not on
    ``Thread.join``: in CPython 3.11 a join interrupted by a signal can mark the thread stopped while
    it still runs, and the exception raised in the worker may land anywhere, so the worker's last
    steps are retried until they are done."""
    outcome: dict = {}
    claim: dict = {}  # who runs first decides (setdefault is atomic): the worker, or the caller giving up
    finished: list = []
    wake = threading.Event()
    owner = caller_ident()

    def run():
        try:
            if claim.setdefault("by", "worker") != "worker":
                return  # the caller was interrupted while starting this thread, and has gone
            _acting.ident = owner
            token = object()
            try:
                enter(token, limit)
                outcome["value"] = fn(*args)
            except BaseException as err:  # noqa: BLE001 - handed back to the calling thread
                outcome["error"] = err
            finally:
                _users.discard(token)
                _surely(_leave, token, reraise=False)
        finally:
            _surely(_finish, finished, wake, reraise=False)

    worker = threading.Thread(target=run, name="tensorvm-deep-recursion", daemon=True)
    interrupted = None
    try:
        _start(worker, stack_bytes)
    except BaseException as err:  # noqa: BLE001 - interrupted while starting: has the worker begun?
        if claim.setdefault("by", "caller") == "caller":
            if isinstance(err, RuntimeError):  # no thread: the process's address space is short of the stack
                from ..errors import ExecutionError

                raise ExecutionError(f"a recursion too deep for this thread's stack was to run again on one of "
                                     f"{stack_bytes >> 20} MB, which could not be made ({err})") from None
            raise  # it will not run fn (if it exists at all)
        interrupted = err
        _raise_in(worker, type(err), finished)
    while not finished:
        try:
            wake.wait(0.05)
        except BaseException as err:  # noqa: BLE001 - (KeyboardInterrupt) stop the worker, then raise
            interrupted = interrupted or err
            _raise_in(worker, type(err), finished)
    if interrupted is not None:
        raise interrupted
    if "value" not in outcome:
        raise outcome.get("error") or RuntimeError("the deep-stack worker ended without a result")
    return outcome["value"]


def _finish(finished: list, wake: threading.Event) -> None:
    if not finished:
        finished.append(True)
    wake.set()


def _surely(step, *args, reraise: bool = True) -> None:
    """Run ``step(*args)`` (idempotent) to the end, again when an exception raised in this thread from
    outside (an interrupt) stops it; that exception is raised afterwards when ``reraise``."""
    pending = None
    for attempt in range(10):  # (bounded: a step that fails for another reason fails for good)
        try:
            step(*args)
            break
        except BaseException as err:  # noqa: BLE001 - retried
            pending = pending or err
            if attempt == 9:
                raise
    if pending is not None and reraise:
        raise pending


def _raise_in(thread: threading.Thread, kind: type, finished: list) -> None:
    """Make ``thread`` raise ``kind`` at its next Python instruction, unless it has finished its call."""
    if not finished and thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(kind))


_gc_pausers: set = set()  # a token per run that paused the collector
GC_PAUSERS = _gc_pausers
_gc_owed = False          # the collector was enabled when the first paused it: enable it after the last


def pause_gc(token) -> None:
    """Pause the cyclic collector until ``resume_gc(token)`` (counted: threads may overlap)."""
    global _gc_owed
    with _LOCK:
        if not _gc_pausers and gc.isenabled():
            _gc_owed = True  # first: an interrupt between the two lines must not lose the enable
            gc.disable()
        _gc_pausers.add(token)


def resume_gc(token) -> None:
    """The end of ``pause_gc(token)``; idempotent (also after an interrupted ``pause_gc``). Callers first
    run ``GC_PAUSERS.discard(token)`` (see ``leave``)."""
    _surely(_resume_gc, token)


def _resume_gc(token) -> None:
    global _gc_owed
    with _LOCK:
        _gc_pausers.discard(token)
        if not _gc_pausers and _gc_owed:
            gc.enable()
            _gc_owed = False
