"""The library's objects (MatMul, Attention, AttentionOps) the ops launch through, one per key, the
least recently used dropped past a bound: a job whose layouts or masks change every step keeps a
bounded number (a new object of a shape already compiled costs no NVRTC run: the library shares the
code between such layouts)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable


class ObjectCache:
    def __init__(self, limit: int):
        self._limit = limit
        self._objects: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], object]):
        """The object of key, made by make() (outside the lock: it may take a while) when there is none."""
        with self._lock:
            obj = self._objects.get(key)
            if obj is not None:
                self._objects.move_to_end(key)
                return obj
        obj = make()
        with self._lock:
            self._objects[key] = obj
            while len(self._objects) > self._limit:
                self._objects.popitem(last=False)
        return obj
