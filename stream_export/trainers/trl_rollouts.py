"""TRL's two ways in, from the feed: a ``rollout_func`` for ``GRPOTrainer`` and a
rollout worker for ``AsyncGRPOTrainer`` (TRL 1.16: ``trl.experimental.async_grpo``).

Both replay recorded rollouts, token for token, from closed groups (the feed's
``groups`` source, or lists of rows): nothing is generated here.

``GRPOTrainer(..., rollout_func=FeedRolloutFunc(feed, num_generations=G),
reward_funcs=recorded_reward)``: TRL repeats each dataset prompt ``G`` times and asks
for one completion per entry; each run of ``G`` entries gets one recorded group of
exactly ``G`` single-segment rollouts (other groups are skipped, counted in
``skipped``). The dataset's prompts only pace TRL (its own prompt ids come back from
the record). TRL computes its advantages from the recorded rewards (``reward``, passed
to reward functions with ``advantage`` and ``weight_version``). Batches are
acknowledged at the next call: TRL generates again only after stepping on the last
generation; ``ack()`` acknowledges the rest after ``train()``.

``AsyncGRPOTrainer(..., rollout_worker=FeedRolloutWorker(feed))``: a thread turns each
row into a ``RolloutSample`` (the group's own advantage, the row's oldest call version
as ``model_version``) on ``rollout_buffer``. A batch is acknowledged at the second
``update_model_version`` after the trainer took its last sample: by then the step
that trained on it is done.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from stream_export.errors import FeedError
from stream_export.trainers.collate import Row, call_spans, rows_of
from stream_export.trainers.supply import BatchLike, Supply

#: What ``FeedRolloutFunc`` answers TRL: its three required fields, ``env_mask`` (0 on
#: the tokens no call sampled: tool results), and what reward functions get.
FIELDS = (
    "prompt_ids",
    "completion_ids",
    "logprobs",
    "env_mask",
    "reward",
    "advantage",
    "weight_version",
)


def recorded_reward(completions: list[Any], reward: list[float], **_: Any) -> list[float]:
    """A TRL reward function giving each completion the reward the fleet recorded."""
    return [float(r) for r in reward]


def _oldest_version(row: Row) -> int:
    versions = [v for _, _, v in call_spans(row) if v >= 0]
    return min(versions, default=0)


class FeedRolloutFunc:
    """``GRPOTrainer``'s ``rollout_func`` (see the module's description)."""

    def __init__(self, batches: Iterable[BatchLike], *, num_generations: int) -> None:
        self.supply = Supply(batches)
        self.num_generations = num_generations
        self.skipped: Counter[str] = Counter()
        self._pending: list[BatchLike] = []

    def _group(self) -> list[Row]:
        while True:
            rows = rows_of(self.supply.take())
            episodes = {row.get("episode_id") for row in rows}
            if len(rows) != self.num_generations:
                self.skipped["size"] += 1
            elif len(episodes) != len(rows):
                self.skipped["segments"] += 1
            else:
                return rows

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        self.ack()
        if len(prompts) % self.num_generations:
            raise FeedError(f"{len(prompts)} prompts is no multiple of {self.num_generations}")
        out: dict[str, list[Any]] = {k: [] for k in FIELDS}
        for _ in range(len(prompts) // self.num_generations):
            for row in self._group():
                cut = row["prompt_len"]
                out["prompt_ids"].append(list(row["input_ids"][:cut]))
                out["completion_ids"].append(list(row["input_ids"][cut:]))
                out["logprobs"].append(list(row["logprobs"][cut:]))
                out["env_mask"].append(list(row["loss_mask"][cut:]))
                out["reward"].append(float(row["reward"]))
                out["advantage"].append(float(row["advantage"]))
                out["weight_version"].append(_oldest_version(row))
        self._pending += self.supply.handed_out()
        return out

    def ack(self) -> None:
        """Acknowledge the batches handed out to TRL so far."""
        for batch in self._pending:
            batch.ack()
        self._pending = []


class _Taken(queue.Queue[Any]):
    """A queue that counts what was taken from it."""

    taken = 0

    def _get(self) -> Any:
        self.taken += 1
        return super()._get()


class FeedRolloutWorker:
    """``AsyncGRPOTrainer``'s rollout worker (``RolloutWorkerProtocol``, see the
    module's description)."""

    def __init__(self, batches: Iterable[BatchLike], *, queue_maxsize: int = 0) -> None:
        self.rollout_buffer: _Taken = _Taken(queue_maxsize)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.model_version = 0
        self._supply = Supply(batches)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_put = time.monotonic()
        self._put = 0
        self._group_ids: dict[str, int] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        #: [batch, samples put when it was handed out]; and ``taken`` at the last update.
        self._out: list[tuple[BatchLike, int]] = []
        self._taken_before = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="feed-rollouts", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    item = self._supply.take()
                except StopIteration:
                    return
                for row in rows_of(item):
                    self._offer(self.sample(row))
                with self._lock:
                    self._out += [(b, self._put) for b in self._supply.handed_out()]
        except BaseException as error:  # reported by check_health, on the trainer's thread
            self._error = error

    def _offer(self, sample: Any) -> None:
        while not self._stop.is_set():
            try:
                self.rollout_buffer.put(sample, timeout=0.2)
            except queue.Full:
                continue
            self._put += 1
            self._last_put = time.monotonic()
            return

    def sample(self, row: Row) -> Any:
        """A row as TRL's ``RolloutSample``; ``group_id`` numbers the groups in order."""
        import numpy as np
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        group = str(row.get("group_id") or row.get("uid") or "")
        if group not in self._group_ids:
            self._group_ids[group] = next(self._numbers)
        number = self._group_ids[group]
        return RolloutSample(
            prompt=[],
            completion=[],
            input_ids=np.asarray(row["input_ids"], dtype=np.int64),
            completion_mask=np.asarray(row["loss_mask"], dtype=np.int64),
            old_log_probs=np.asarray(row["logprobs"], dtype=np.float32),
            advantage=float(row["advantage"]),
            model_version=_oldest_version(row),
            group_id=number,
            metrics={"reward": float(row.get("reward") or 0.0)},
            enqueued_at=time.time(),
        )

    def update_model_version(self, model_version: int) -> None:
        """The trainer stepped: acknowledge the batches whose samples were all taken
        before its previous update."""
        self.model_version = model_version
        with self._lock:
            done = [b for b, put in self._out if put <= self._taken_before]
            self._out = [(b, put) for b, put in self._out if put > self._taken_before]
        for batch in done:
            batch.ack()
        self._taken_before = self.rollout_buffer.taken

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise FeedError(f"the feed's rollout worker failed: {self._error!r}")
        quiet = time.monotonic() - self._last_put
        if self._thread is not None and self._thread.is_alive() and quiet > stale_after_s:
            raise FeedError(f"no rollout from the feed for {quiet:.0f} s")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
