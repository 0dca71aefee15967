"""Whole-group admission: the groups whose start passed the lag bounds (no I/O).

A lag bound (``gateway.max_consumer_lag``, ``max_feed_lag``) holds the start of a
group of rollouts, never the rest of one. Held per call, a group was cut in two:
its first rollouts sampled, the others waited for the trainer, which waited for
that group. Once one call of a grouped episode went through under the bounds,
the calls of up to ``group_size`` episodes of its group (the first call's size)
go through without waiting on a lag.

The book is bounded: a group is forgotten once ``group_size`` of its episodes
ended (all that went through among them), once no call of it came since a given
time (the gateway's episode idle timeout), or, past ``max_groups``, the least
recently active first (counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Group:
    size: int
    #: The episodes whose calls go through (at most ``size``).
    members: set[str] = field(default_factory=set)
    #: The episodes of the group that ended: its members, and others up to ``size``.
    ended: set[str] = field(default_factory=set)
    #: When a call of it last went through (time.time()).
    at: float = 0.0


class AdmittedGroups:
    """The groups admitted under the lag bounds, by group id, the least recently
    active first."""

    def __init__(self, max_groups: int) -> None:
        self.max_groups = max_groups
        self.groups: dict[str, _Group] = {}

    def __len__(self) -> int:
        return len(self.groups)

    def covers(self, group_id: str | None, episode_id: str) -> bool:
        """Whether the episode's calls go through without waiting on a lag: its group
        was admitted, and it is one of the group's first ``group_size`` episodes."""
        if group_id is None or (group := self.groups.get(group_id)) is None:
            return False
        return episode_id in group.members or len(group.members) < group.size

    def admit(self, group_id: str, size: int, episode_id: str, at: float) -> int:
        """A call of the episode went through (under the lag bounds, or covered by its
        group): remember its group, the episode in it if there is room. How many
        other groups were forgotten to stay within ``max_groups``."""
        group = self.groups.pop(group_id, None) or _Group(size)
        if len(group.members) < group.size:
            group.members.add(episode_id)
        group.at = at
        self.groups[group_id] = group  # the most recently active last
        dropped = 0
        while len(self.groups) > self.max_groups:
            del self.groups[next(iter(self.groups))]
            dropped += 1
        return dropped

    def ended(self, group_id: str | None, episode_id: str) -> None:
        """An episode of the group ended: the group is forgotten once ``group_size``
        of its episodes did, its members among them (an episode past the size ends
        without cutting a member's later calls)."""
        if group_id is None or (group := self.groups.get(group_id)) is None:
            return
        if episode_id in group.members or len(group.ended) < group.size:
            group.ended.add(episode_id)
        if len(group.ended) >= group.size and group.members <= group.ended:
            del self.groups[group_id]

    def forget(self, before: float) -> int:
        """Forget the groups with no call since ``before``; how many."""
        idle = [key for key, group in self.groups.items() if group.at < before]
        for key in idle:
            del self.groups[key]
        return len(idle)
