"""What a watch holds of each job's objects, by uid (the pod watch's pods, the Workload watch's
Workloads), and the index the controller reads: a job's key -> its objects, as they are now."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

JobKey = tuple[str, str]
T = TypeVar("T")
Listed = tuple[JobKey, str, T]  # a listed object of a job: the job's key, the object's uid, what is held


class ByJob(Mapping[JobKey, Iterable[T]], Generic[T]):
    def __init__(self) -> None:
        self.held: dict[JobKey, dict[str, T]] = {}  # job -> uid -> object
        self.where: dict[str, JobKey] = {}  # uid -> job: an object whose label changes is found

    def __getitem__(self, key: JobKey) -> Iterable[T]:
        return self.held[key].values()

    def __iter__(self) -> Iterator[JobKey]:
        return iter(self.held)

    def __len__(self) -> int:
        return len(self.held)

    def find(self, uid: str) -> tuple[JobKey, T] | None:
        key = self.where.get(uid)
        found = self.held.get(key, {}).get(uid) if key is not None else None
        return (key, found) if key is not None and found is not None else None

    def replace(self, scope: str | None, listed: Iterable[Listed[T]]) -> list[JobKey]:
        """A scope's list (None: every namespace): what was held there and is absent now is dropped.
        The keys of the jobs whose objects changed."""
        found: dict[JobKey, dict[str, T]] = {}
        for key, uid, held in listed:
            found.setdefault(key, {})[uid] = held
        changed = []
        for key in [k for k in self.held if scope is None or k[0] == scope]:
            for uid in self.held[key]:
                self.where.pop(uid, None)
            if key not in found:
                del self.held[key]
                changed.append(key)
        for key, objects in found.items():
            self.where.update(dict.fromkeys(objects, key))
            if self.held.get(key) != objects:
                self.held[key] = objects
                changed.append(key)
        return changed

    def apply(self, uid: str, key: JobKey | None, held: T) -> tuple[JobKey | None, bool]:
        """A watch event's object: held under `key` (None: deleted, or no longer a job's). The key it
        left (deleted, or its job-name label or owner edited), if any; whether `key`'s objects changed."""
        left = self.where.get(uid)
        if left is not None and left != key:
            objects = self.held[left]
            del objects[uid], self.where[uid]
            if not objects:
                del self.held[left]
        else:
            left = None
        if key is None:
            return left, False
        objects = self.held.setdefault(key, {})
        if objects.get(uid) == held:
            return left, False
        objects[uid], self.where[uid] = held, key
        return left, True
