#!/usr/bin/env python3
"""faces: a custom imagepipe stage in Python that counts the faces in each image.

A worker of the stage `faces` of `pipeline.stages` (README.md beside this file): it takes the
stage's commands from `<prefix>.tasks.faces` and its priority lanes `.high` and `.low` (NATS
JetStream or Kafka), fetches the task's preview (else its original) with
`GET {coordinator}/v1/blobs/{key}`, finds the frontal faces with OpenCV's Haar cascade (the
`haarcascade_frontalface_default.xml` of the opencv-python-headless wheel), and reports the step
result to `<prefix>.tasks.results`:

    {"count": 1, "boxes": [[176, 65, 95, 95]], "tags": ["faces:1"],
     "image": {"blob": "preview", "width": 512, "height": 512}}

Boxes are `[x, y, width, height]` in pixels of the image analysed (`image`). The coordinator keeps
the output under `outputs.faces` of the task, publishes `stage.completed`, and the tag indexer
indexes the tags (`GET /v1/search?tags=faces:1`).

Delivery is at least once: a command is acknowledged (NATS) or its offset committed (Kafka) only
once its result was confirmed by the broker; the result's message id is
`<taskId>:<stage>:<attempt>`, so a repeat is dropped by the broker (NATS) or the coordinator
(Kafka) and a stale one ignored by the coordinator. A fetch that fails is reported `retryable`
(the coordinator tries again with backoff, up to the stage's `attempts`), an image OpenCV cannot
decode `permanent` (the task fails with the reason). A command that is not a command of this
stage (not JSON, a field missing or of the wrong type, another stage's) can never succeed and has
no attempt to report on: it is dead-lettered to `<prefix>.dlq.tasks.faces` with the reason (as
the Rust workers do, where `imagepipe dlq list` shows it) and acknowledged, so it does not loop.
On NATS a command delivered more than `--max-deliveries` times without being settled (the worker
died on it each time) is dead-lettered the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import re
import secrets
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import cv2
import numpy as np

log = logging.getLogger("faces")

SCHEMA_VERSION = "1"
BLOB_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")
LANES = (("high", ".high"), ("normal", ""), ("low", ".low"))
# Guaranteed shares of the lanes, as the Rust workers' `worker.priority_shares` (70/20/10).
LANE_WEIGHTS = {"high": 70, "normal": 20, "low": 10}
MAX_REASON_BYTES = 4096


# --- the stage's own work --------------------------------------------------------------------


class StepFailure(Exception):
    """An attempt that failed: `retryable` or not, with a stable code and a message."""

    def __init__(self, code: str, message: str, retryable: bool, retry_after_ms: Optional[int] = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.retryable, self.retry_after_ms = code, message, retryable, retry_after_ms


class Malformed(Exception):
    """A message that is no command of this stage: dead-lettered, never retried."""


@dataclass
class Command:
    task_id: str
    stage: str
    attempt: int
    blob: str
    blob_name: str
    format: str


def parse_command(body: bytes, stage: str) -> Command:
    """The command in `body`, or `Malformed` saying what is wrong with it."""
    try:
        command = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise Malformed(f"not JSON: {e}") from None
    if not isinstance(command, dict):
        raise Malformed("not a JSON object")

    def text(name: str, where: dict = command) -> str:
        value = where.get(name)
        if not isinstance(value, str) or not value:
            raise Malformed(f"{name} must be a non-empty string, got {value!r}")
        return value

    task_id, name = text("taskId"), text("stage")
    if name != stage:
        raise Malformed(f"a command of stage {name!r} on the queue of stage {stage!r}")
    attempt = command.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise Malformed(f"attempt must be an integer from 1, got {attempt!r}")
    blobs = command.get("blobs")
    if not isinstance(blobs, dict):
        raise Malformed(f"blobs must be an object, got {blobs!r}")
    derivatives = blobs.get("derivatives") or {}
    if not isinstance(derivatives, dict):
        raise Malformed(f"blobs.derivatives must be an object, got {derivatives!r}")
    # The preview (upright, at most 1440 px) when the metadata step wrote one, else the original.
    for blob_name, key in (("preview", blobs.get("preview")), ("preview", derivatives.get("preview")),
                           ("original", blobs.get("original"))):
        if key is not None:
            if not isinstance(key, str) or not BLOB_KEY.match(key):
                raise Malformed(f"blob key {key!r} ({blob_name}) is not sha256:<64 hex digits>")
            return Command(task_id, name, attempt, key, blob_name, str(command.get("format") or ""))
    raise Malformed("blobs has no preview and no original")


class Detector:
    """OpenCV's frontal-face Haar cascade; one classifier per thread (they are not shared)."""

    CASCADE = "haarcascade_frontalface_default.xml"

    def __init__(self, max_side: int):
        self.path = os.path.join(cv2.data.haarcascades, self.CASCADE)
        if not os.path.isfile(self.path):
            raise SystemExit(f"faces: no Haar cascade at {self.path} (opencv-python-headless ships it)")
        self.max_side = max_side
        self.local = threading.local()

    def classifier(self) -> cv2.CascadeClassifier:
        if not hasattr(self.local, "classifier"):
            classifier = cv2.CascadeClassifier(self.path)
            if classifier.empty():
                raise SystemExit(f"faces: OpenCV could not load {self.path}")
            self.local.classifier = classifier
        return self.local.classifier

    def detect(self, data: bytes) -> dict[str, Any]:
        """Faces in the encoded image `data`; `StepFailure` (permanent) when it does not decode."""
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)
        if image is None or image.size == 0:
            raise StepFailure("not_an_image", f"OpenCV cannot decode these {len(data)} bytes", retryable=False)
        height, width = image.shape[:2]
        scale = 1.0
        if max(height, width) > self.max_side:
            scale = self.max_side / max(height, width)
            image = cv2.resize(image, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
        found = self.classifier().detectMultiScale(
            cv2.equalizeHist(image), scaleFactor=1.1, minNeighbors=5, minSize=(30, 30))
        boxes = sorted([[round(int(v) / scale) for v in box] for box in found])
        return {"count": len(boxes), "boxes": boxes, "tags": [f"faces:{len(boxes)}"],
                "image": {"width": width, "height": height}}


class Blobs:
    """`GET {coordinator}/v1/blobs/{key}`, with the API token when there is one."""

    def __init__(self, coordinator: str, token: Optional[str], timeout: float, max_bytes: int):
        self.base, self.token, self.timeout, self.max_bytes = coordinator.rstrip("/"), token, timeout, max_bytes

    def get(self, key: str) -> bytes:
        request = urllib.request.Request(f"{self.base}/v1/blobs/{key}")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data = response.read(self.max_bytes + 1)
        except urllib.error.HTTPError as e:
            retry_after = e.headers.get("Retry-After", "") if e.headers else ""
            delay = int(retry_after) * 1000 if retry_after.isdigit() else None
            raise StepFailure(f"blob_http_{e.code}", f"GET /v1/blobs/{key}: {e.code} {e.reason}",
                              retryable=True, retry_after_ms=delay) from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            raise StepFailure("blob_fetch_failed", f"GET {self.base}/v1/blobs/{key}: {e}", retryable=True) from None
        if len(data) > self.max_bytes:
            raise StepFailure("too_large", f"blob {key} is over {self.max_bytes} bytes", retryable=False)
        return data


class QueuePause:
    """Whether an operator paused the stage's queue (`POST /v1/queues/<stage>/pause`): the
    `paused` field of its entry in the coordinator's `GET /v1/queues`, read every `poll` seconds.
    While it is paused the worker fetches nothing; commands in flight finish. A read that fails
    keeps the last state (logged once until a read succeeds again)."""

    def __init__(self, coordinator: str, token: Optional[str], stage: str, poll: float, timeout: float):
        self.base, self.token, self.stage, self.poll, self.timeout = coordinator.rstrip("/"), token, stage, poll, timeout
        self.paused = False
        self.failing = False

    def read(self) -> bool:
        request = urllib.request.Request(f"{self.base}/v1/queues")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            view = json.load(response)
        return any(q.get("name") == self.stage and q.get("paused") is True for q in view.get("queues", []))

    async def refresh(self) -> None:
        try:
            paused = await asyncio.get_running_loop().run_in_executor(None, self.read)
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as e:
            if not self.failing:
                log.warning("reading GET %s/v1/queues: %s; keeping the queue's last state (%s)", self.base, e,
                            "paused" if self.paused else "running")
                self.failing = True
            return
        if self.failing:
            log.info("GET %s/v1/queues answers again", self.base)
            self.failing = False
        if paused != self.paused:
            log.info("queue %s %s", self.stage, "paused: fetching nothing" if paused else "resumed")
            self.paused = paused

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), self.poll)
            except asyncio.TimeoutError:
                await self.refresh()


@dataclass
class Stage:
    """Runs one command: the outcome of the attempt, as the step result's `outcome`."""

    name: str
    blobs: Blobs
    detector: Detector
    pool: ThreadPoolExecutor

    async def run(self, command: Command) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(self.pool, self.blobs.get, command.blob)
            output = await loop.run_in_executor(self.pool, self.detector.detect, data)
        except StepFailure as failure:
            error = {"code": failure.code, "message": failure.message}
            log.warning("task %s attempt %d: %s", command.task_id, command.attempt, failure)
            if not failure.retryable:
                return {"status": "permanent", "error": error}
            outcome: dict[str, Any] = {"status": "retryable", "error": error}
            if failure.retry_after_ms is not None:
                outcome["retryAfterMs"] = failure.retry_after_ms
            return outcome
        output["image"] = {"blob": command.blob_name, **output["image"]}
        log.info("task %s attempt %d: %d face(s) in the %s", command.task_id, command.attempt,
                 output["count"], command.blob_name)
        return {"status": "ok", "output": {"stage": output}}


# --- messages ----------------------------------------------------------------------------------


def now_rfc3339() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def child_traceparent(parent: Optional[str]) -> Optional[str]:
    """A `traceparent` in the command's trace (a span of our own), so the trace goes on."""
    parts = (parent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    return f"00-{parts[1]}-{secrets.token_hex(8)}-{parts[3]}"


@dataclass
class Result:
    """A step result ready to send: where, its body, its id and its headers (binding-neutral)."""

    queue: str
    partition: Optional[int]
    task_id: str
    message_id: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def result_of(command: Command, outcome: dict, lane: str, headers: dict[str, str], service: str) -> Result:
    """The step result of `command`, to the lane it came in on and the shard it names."""
    message_id = f"{command.task_id}:{command.stage}:{command.attempt}"
    body = json.dumps({"taskId": command.task_id, "step": command.stage, "attempt": command.attempt,
                       "outcome": outcome}, separators=(",", ":")).encode()
    shard = headers.get("imagepipe-shard", "")
    out = {
        "imagepipe-schema": SCHEMA_VERSION,
        "ce-id": message_id,
        "ce-source": f"/imagepipe/{service}",
        "ce-specversion": "1.0",
        "ce-type": "step.result",
        "ce-time": now_rfc3339(),
        "content-type": "application/json",
        "ce-subject": command.task_id,
    }
    traceparent = child_traceparent(headers.get("traceparent"))
    if traceparent:
        out["traceparent"] = traceparent
    queue = "tasks.results" + ("" if lane == "normal" else f".{lane}")
    return Result(queue, int(shard) if shard.isdigit() else None, command.task_id, message_id, body, out)


def bounded(text: str, limit: int = MAX_REASON_BYTES) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore") + "…"


def dead_letter_headers(reason: str, delivered: int, source: str) -> dict[str, str]:
    return {"imagepipe-dlq-reason": bounded(reason.replace("\n", " ").replace("\r", " ")),
            "imagepipe-dlq-delivery-count": str(delivered),
            "imagepipe-dlq-source": source,
            "imagepipe-dlq-timestamp": str(int(time.time() * 1000))}


# --- the worker loop, the same on both brokers -------------------------------------------------


@dataclass
class Delivery:
    """One command as received: its body, headers (lower-case names), lane and how to settle it."""

    body: bytes
    headers: dict[str, str]
    lane: str
    delivered: int  # how often the broker handed it out (1 where the broker does not say)
    done: Callable[[], Awaitable[None]]  # settled: acknowledge / mark its offset committable
    again: Callable[[float], Awaitable[None]]  # not settled: have it delivered again after delay s
    dead_letter: Callable[[str], Awaitable[None]]  # to the stage's dead-letter queue, then done
    keep_alive: Callable[[], Awaitable[None]]  # still working on it (extends the ack deadline)


class Backend:
    """A broker: lanes to fetch from, results to send."""

    async def fetch(self, lane: str, count: int) -> list[Delivery]:
        raise NotImplementedError

    async def send(self, result: Result) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class Worker:
    def __init__(self, backend: Backend, stage: Stage, pause: QueuePause, args: argparse.Namespace):
        self.backend, self.stage, self.pause, self.args = backend, stage, pause, args
        self.stopping = asyncio.Event()
        self.running: set[asyncio.Task] = set()
        self.credit = {lane: 0 for lane, _ in LANES}

    def lane_order(self) -> list[str]:
        """Smooth weighted round-robin: the lane whose turn it is first, the others after it."""
        total = sum(LANE_WEIGHTS.values())
        for lane in self.credit:
            self.credit[lane] += LANE_WEIGHTS[lane]
        first = max(self.credit, key=lambda lane: self.credit[lane])
        self.credit[first] -= total
        return [first] + [lane for lane, _ in LANES if lane != first]

    async def run(self) -> None:
        concurrency = self.args.concurrency
        while not self.stopping.is_set():
            if self.pause.paused:
                await asyncio.sleep(min(self.pause.poll, 0.25))
                continue
            free = concurrency - len(self.running)
            if free <= 0:
                await asyncio.wait(self.running, return_when=asyncio.FIRST_COMPLETED)
                continue
            fetched: list[Delivery] = []
            for lane in self.lane_order():
                try:
                    fetched = await self.backend.fetch(lane, free)
                except Exception as e:  # a broker hiccup: log, wait, go on
                    log.warning("fetching from the %s lane: %s", lane, e)
                    await asyncio.sleep(1)
                if fetched:
                    break
            for delivery in fetched:
                task = asyncio.create_task(self.handle(delivery))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
        if self.running:
            log.info("stopping: waiting for %d command(s) in flight", len(self.running))
            await asyncio.wait(self.running, timeout=self.args.grace)

    async def handle(self, delivery: Delivery) -> None:
        queue = f"tasks.{self.stage.name}"
        try:
            command = parse_command(delivery.body, self.stage.name)
        except Malformed as e:
            log.error("dead-lettering a malformed command from %s (%s lane): %s", queue, delivery.lane, e)
            await self.settle(delivery.dead_letter(f"malformed command: {e}"), delivery)
            return
        if delivery.delivered > self.args.max_deliveries:
            reason = f"delivered {delivery.delivered} times without being settled (max {self.args.max_deliveries})"
            log.error("dead-lettering task %s attempt %d: %s", command.task_id, command.attempt, reason)
            await self.settle(delivery.dead_letter(reason), delivery)
            return
        keep_alive = asyncio.create_task(self.keep_alive(delivery))
        try:
            outcome = await self.stage.run(command)
            result = result_of(command, outcome, delivery.lane, delivery.headers, self.args.service)
            backoff = 0.5
            while True:
                try:
                    await self.backend.send(result)
                    break
                except Exception as e:
                    if self.stopping.is_set():
                        log.warning("task %s: result not sent before stopping (%s): left for redelivery",
                                    command.task_id, e)
                        await self.settle(delivery.again(0), delivery)
                        return
                    log.warning("task %s: sending the result failed (%s); again in %.1fs", command.task_id, e, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30)
        except Exception:
            log.exception("task %s attempt %d: unexpected failure; redelivered in 5s", command.task_id, command.attempt)
            await self.settle(delivery.again(5), delivery)
            return
        finally:
            keep_alive.cancel()
        await self.settle(delivery.done(), delivery)

    async def settle(self, settlement: Awaitable[None], delivery: Delivery) -> None:
        try:
            await settlement
        except Exception as e:  # not settled: the broker delivers it again, the result is deduplicated
            log.warning("settling a command of the %s lane failed: %s", delivery.lane, e)

    async def keep_alive(self, delivery: Delivery) -> None:
        while True:
            await asyncio.sleep(max(self.args.ack_wait / 3, 1))
            try:
                await delivery.keep_alive()
            except Exception as e:
                log.warning("extending the ack deadline: %s", e)


# --- NATS JetStream ----------------------------------------------------------------------------


def sanitize(name: str) -> str:
    """A stream or consumer name of the Rust bus: every character but [A-Za-z0-9_-] as `_`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


class Nats(Backend):
    """The work-queue stream `<PREFIX>_TASKS`: one durable pull consumer per lane, named and
    filtered as the Rust workers name theirs (`tasks_faces` on `<prefix>.tasks.faces`,
    `tasks_faces_high` on `<prefix>.tasks.faces.high`, ...), shared by every replica."""

    async def start(self, args: argparse.Namespace) -> "Nats":
        import nats
        from nats.js import api
        from nats.js.errors import NotFoundError

        self.args, self.prefix = args, args.prefix
        self.nc = await nats.connect(args.nats_url, name=f"imagepipe-{args.stage}-stage", max_reconnect_attempts=-1,
                                     reconnect_time_wait=1, connect_timeout=5)
        self.js = self.nc.jetstream(timeout=10)
        stream = f"{sanitize(self.prefix).upper()}_TASKS"
        self.subscriptions = {}
        waited = 0.0
        while True:  # the coordinator creates the stream: wait for it rather than make one unlike it
            try:
                await self.js.stream_info(stream)
                break
            except NotFoundError:
                if waited == 0:
                    log.info("waiting for the stream %s (the coordinator creates it)", stream)
                await asyncio.sleep(0.5)
                waited += 0.5
        for lane, suffix in LANES:
            queue = f"tasks.{args.stage}{suffix}"
            durable, subject = sanitize(queue), f"{self.prefix}.{queue}"
            try:
                info = await self.js.consumer_info(stream, durable)
                if info.config.filter_subject != subject:
                    raise SystemExit(f"faces: consumer {durable} on {stream} filters {info.config.filter_subject!r}, "
                                     f"not {subject!r}")
            except NotFoundError:
                await self.js.add_consumer(stream, api.ConsumerConfig(
                    durable_name=durable,
                    description=f"imagepipe queue {queue}",
                    filter_subject=subject,
                    deliver_policy=api.DeliverPolicy.ALL,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    ack_wait=args.ack_wait,
                    # One more than allowed: the delivery past the limit is dead-lettered here.
                    max_deliver=args.max_deliveries + 1,
                    replay_policy=api.ReplayPolicy.INSTANT,
                ))
            self.subscriptions[lane] = await self.js.pull_subscribe_bind(durable, stream)
        self.stream = stream
        return self

    async def fetch(self, lane: str, count: int) -> list[Delivery]:
        from nats.errors import TimeoutError as NatsTimeout

        # A short wait: an empty lane passes the turn to the next one soon.
        try:
            messages = await self.subscriptions[lane].fetch(count, timeout=0.25)
        except (NatsTimeout, asyncio.TimeoutError):
            return []
        return [self.delivery(message, lane) for message in messages]

    def delivery(self, message, lane: str) -> Delivery:
        headers = {name.lower(): value for name, value in (message.headers or {}).items()}
        meta = message.metadata
        source = f"tasks.{self.args.stage}" + ("" if lane == "normal" else f".{lane}")

        async def dead_letter(reason: str) -> None:
            kept = {name: value for name, value in (message.headers or {}).items()
                    if not name.lower().startswith("nats-")}
            original = headers.get("nats-msg-id")
            if original:
                kept["imagepipe-message-id"] = original
            kept.update(dead_letter_headers(reason, meta.num_delivered, source))
            kept["Nats-Msg-Id"] = f"dlq:{self.stream}_{sanitize(source)}:{meta.sequence.stream}"
            await self.js.publish(f"{self.prefix}.dlq.tasks.{self.args.stage}", message.data, headers=kept)
            await message.ack()

        return Delivery(
            body=message.data, headers=headers, lane=lane, delivered=meta.num_delivered,
            done=message.ack, again=lambda delay: message.nak(delay=delay or None),
            dead_letter=dead_letter, keep_alive=message.in_progress)

    async def send(self, result: Result) -> None:
        subject = f"{self.prefix}.{result.queue}" + ("" if result.partition is None else f".{result.partition}")
        headers = dict(result.headers, **{"Nats-Msg-Id": result.message_id, "imagepipe-key": result.task_id})
        await self.js.publish(subject, result.body, headers=headers, timeout=10)

    async def close(self) -> None:
        # Not drain(): it waits out the pull subscriptions' pending fetches. Everything sent was
        # confirmed, everything settled was acknowledged (flushed here).
        await self.nc.flush(timeout=5)
        await self.nc.close()


# --- Kafka -------------------------------------------------------------------------------------


class Kafka(Backend):
    """One consumer group per lane, named as the Rust workers name theirs (`<prefix>.tasks.faces`,
    `<prefix>.tasks.faces.high`, ...), offsets committed by hand once the commands below them
    are settled; results produced idempotently to partition = the command's shard."""

    async def start(self, args: argparse.Namespace) -> "Kafka":
        from confluent_kafka import Consumer, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        self.args, self.prefix = args, args.prefix
        base = {"bootstrap.servers": args.kafka_brokers, "client.id": f"imagepipe-{args.stage}-stage"}
        # The stage's topics, when the coordinator has not created them yet (it may start later).
        topics = [f"{self.prefix}.tasks.{args.stage}{suffix}" for _, suffix in LANES]
        topics.append(f"{self.prefix}.dlq.tasks.{args.stage}")
        admin = AdminClient(base)
        for topic, future in admin.create_topics(
                [NewTopic(t, num_partitions=args.kafka_partitions, replication_factor=1) for t in topics],
                request_timeout=15).items():
            try:
                await asyncio.wrap_future(future)
                log.info("created topic %s", topic)
            except Exception as e:
                if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
                    raise SystemExit(f"faces: creating topic {topic}: {e}")
        self.producer = Producer({**base, "enable.idempotence": True, "acks": "all", "linger.ms": 1,
                                  # Kafka's own partitioner (murmur2), as the coordinator's shards.
                                  "partitioner": "murmur2_random", "message.timeout.ms": 30000})
        self.consumers, self.threads, self.pending = {}, {}, {}
        for lane, suffix in LANES:
            queue = f"tasks.{args.stage}{suffix}"
            consumer = Consumer({**base, "group.id": f"{self.prefix}.{queue}", "enable.auto.commit": False,
                                 "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
                                 "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
                                 "fetch.wait.max.ms": 100, "max.poll.interval.ms": 600000})
            consumer.subscribe([f"{self.prefix}.{queue}"], on_revoke=self.revoked(lane))
            self.consumers[lane] = consumer
            # A consumer is used from one thread only.
            self.threads[lane] = ThreadPoolExecutor(1, thread_name_prefix=f"kafka-{lane}")
            self.pending[lane] = {}
        self.producer_thread = threading.Thread(target=self.serve_producer, daemon=True)
        self.closed = False
        self.producer_thread.start()
        return self

    def revoked(self, lane: str):
        def forget(consumer, partitions) -> None:
            # Their offsets are another member's to commit now; what is in flight is redelivered.
            for p in partitions:
                self.pending[lane].pop((p.topic, p.partition), None)
        return forget

    def serve_producer(self) -> None:
        while not self.closed:
            self.producer.poll(0.1)

    async def on(self, lane: str, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.threads[lane], call)

    async def fetch(self, lane: str, count: int) -> list[Delivery]:
        consumer = self.consumers[lane]
        records = await self.on(lane, lambda: consumer.consume(num_messages=count, timeout=0.1))
        deliveries = []
        for record in records:
            if record.error():
                log.warning("kafka (%s lane): %s", lane, record.error())
                continue
            deliveries.append(self.delivery(record, lane))
        return deliveries

    def delivery(self, record, lane: str) -> Delivery:
        headers = {}
        for name, value in record.headers() or []:
            name = name.lower()
            headers["ce-" + name[3:] if name.startswith("ce_") else name] = (value or b"").decode(errors="replace")
        where = (record.topic(), record.partition())
        offsets = self.pending[lane].setdefault(where, {})
        offsets[record.offset()] = False
        source = f"tasks.{self.args.stage}" + ("" if lane == "normal" else f".{lane}")

        async def done() -> None:
            await self.commit(lane, where, record.offset())

        async def again(delay: float) -> None:
            # Kafka has no redelivery of one record: seek back to it, so it and what follows
            # it in its partition come again (their results are deduplicated).
            from confluent_kafka import TopicPartition
            await asyncio.sleep(delay)
            self.pending[lane].pop(where, None)
            await self.on(lane, lambda: self.consumers[lane].seek(TopicPartition(*where, record.offset())))

        async def dead_letter(reason: str) -> None:
            kept = [(n, v) for n, v in (record.headers() or []) if not n.startswith("imagepipe-kafka-")]
            kept += list(dead_letter_headers(reason, 1, source).items())
            await self.produce(f"{self.prefix}.dlq.tasks.{self.args.stage}", record.key(), record.value(), kept, None)
            await done()

        async def keep_alive() -> None:
            pass  # offsets wait for the handler; max.poll.interval.ms bounds a stuck one

        return Delivery(body=record.value() or b"", headers=headers, lane=lane, delivered=1, done=done, again=again,
                        dead_letter=dead_letter, keep_alive=keep_alive)

    async def commit(self, lane: str, where: tuple, offset: int) -> None:
        """Marks `offset` settled and commits the partition up to its first unsettled offset."""
        from confluent_kafka import TopicPartition
        offsets = self.pending[lane].get(where)
        if offsets is None or offset not in offsets:
            return  # revoked or sought back meanwhile
        offsets[offset] = True
        upto = None
        for o in sorted(offsets):
            if not offsets[o]:
                break
            upto = o
            del offsets[o]
        if upto is not None:
            partition = TopicPartition(where[0], where[1], upto + 1)
            await self.on(lane, lambda: self.consumers[lane].commit(offsets=[partition], asynchronous=False))

    async def produce(self, topic: str, key, value: bytes, headers: list, partition: Optional[int]) -> None:
        loop = asyncio.get_running_loop()
        delivered = loop.create_future()

        def report(error, _message) -> None:
            outcome = (lambda: delivered.set_exception(RuntimeError(str(error)))) if error else \
                (lambda: delivered.set_result(None))
            loop.call_soon_threadsafe(lambda: None if delivered.done() else outcome())

        extra = {} if partition is None else {"partition": partition}
        self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report, **extra)
        await delivered

    async def send(self, result: Result) -> None:
        headers = [("ce_" + n[3:] if n.startswith("ce-") else n, v) for n, v in result.headers.items()]
        headers.append(("imagepipe-message-id", result.message_id))
        await self.produce(f"{self.prefix}.{result.queue}", result.task_id.encode(), result.body, headers,
                           result.partition)

    async def close(self) -> None:
        self.closed = True
        await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, 10)
        for lane, consumer in self.consumers.items():
            await self.on(lane, consumer.close)


# --- start-up ----------------------------------------------------------------------------------


def arguments(argv: Optional[list[str]] = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description="The faces stage of imagepipe: counts faces with OpenCV's Haar cascade.")
    p.add_argument("--bus", choices=["nats", "kafka"], default=env("IMAGEPIPE_BUS__KIND", "nats"),
                   help="the broker (env IMAGEPIPE_BUS__KIND; default nats)")
    p.add_argument("--nats-url", default=env("IMAGEPIPE_BUS__NATS__URL", "nats://127.0.0.1:4222"),
                   help="NATS server (env IMAGEPIPE_BUS__NATS__URL)")
    p.add_argument("--kafka-brokers", default=env("IMAGEPIPE_BUS__KAFKA__BROKERS", "127.0.0.1:9092"),
                   help="Kafka bootstrap servers (env IMAGEPIPE_BUS__KAFKA__BROKERS)")
    p.add_argument("--kafka-partitions", type=int, default=int(env("IMAGEPIPE_BUS__KAFKA__PARTITIONS", "6")),
                   help="partitions of the stage's topics when this worker creates them (default 6, as bus.kafka.partitions)")
    p.add_argument("--prefix", default=env("IMAGEPIPE_BUS__PREFIX", "imagepipe"),
                   help="bus.prefix of the pipeline (env IMAGEPIPE_BUS__PREFIX; default imagepipe)")
    p.add_argument("--stage", default=env("FACES_STAGE", "faces"),
                   help="the stage's name in pipeline.stages (env FACES_STAGE; default faces)")
    p.add_argument("--coordinator", default=env("FACES_COORDINATOR_URL", "http://127.0.0.1:8080"),
                   help="a coordinator's URL, for GET /v1/blobs/{key} (env FACES_COORDINATOR_URL)")
    p.add_argument("--token", default=env("FACES_COORDINATOR_TOKEN"),
                   help="bearer token of the coordinator's API, scope read (env FACES_COORDINATOR_TOKEN)")
    p.add_argument("--concurrency", type=int, default=int(env("FACES_CONCURRENCY", str(os.cpu_count() or 1))),
                   help="commands worked on at once (env FACES_CONCURRENCY; default the cores)")
    p.add_argument("--ack-wait", type=float, default=float(env("FACES_ACK_WAIT", "60")),
                   help="seconds a NATS delivery may go unacknowledged before it is redelivered (default 60)")
    p.add_argument("--max-deliveries", type=int, default=int(env("FACES_MAX_DELIVERIES", "5")),
                   help="deliveries of one NATS command before it is dead-lettered (default 5)")
    p.add_argument("--max-side", type=int, default=int(env("FACES_MAX_SIDE", "1440")),
                   help="images are searched at most this many pixels on their longer side (default 1440)")
    p.add_argument("--max-blob-bytes", type=int, default=int(env("FACES_MAX_BLOB_BYTES", str(64 << 20))),
                   help="largest blob fetched (default 64 MiB)")
    p.add_argument("--fetch-timeout", type=float, default=float(env("FACES_FETCH_TIMEOUT", "30")),
                   help="seconds a blob fetch may take (default 30)")
    p.add_argument("--pause-poll", type=float, default=float(env("FACES_PAUSE_POLL", "1")),
                   help="seconds between reads of GET /v1/queues for a pause of the stage's queue (default 1; 0: never)")
    p.add_argument("--grace", type=float, default=float(env("FACES_GRACE", "30")),
                   help="seconds to finish the commands in flight on SIGTERM (default 30)")
    p.add_argument("--service", default=env("FACES_SERVICE", "faces-stage"),
                   help="the service name in the results' CloudEvents source (default faces-stage)")
    args = p.parse_args(argv)
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", args.stage):
        p.error(f"--stage {args.stage!r}: lowercase letters, digits and _, starting with a letter, at most 32")
    if args.pause_poll < 0:
        p.error("--pause-poll must be 0 or more")
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


async def main(argv: Optional[list[str]] = None) -> int:
    args = arguments(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cv2.setNumThreads(1)  # the concurrency is the commands in flight, each on one core
    pool = ThreadPoolExecutor(args.concurrency, thread_name_prefix="faces")
    stage = Stage(args.stage, Blobs(args.coordinator, args.token, args.fetch_timeout, args.max_blob_bytes),
                  Detector(args.max_side), pool)
    backend: Backend = await (Nats().start(args) if args.bus == "nats" else Kafka().start(args))
    pause = QueuePause(args.coordinator, args.token, args.stage, args.pause_poll, args.fetch_timeout)
    await pause.refresh()
    worker = Worker(backend, stage, pause, args)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stopping.set)
    watching = asyncio.create_task(pause.run(worker.stopping)) if args.pause_poll > 0 else None
    log.info("ready: stage %s on %s (prefix %s), blobs from %s, %d at once", args.stage, args.bus, args.prefix,
             args.coordinator, args.concurrency)
    await worker.run()
    if watching:
        await watching
    await backend.close()
    pool.shutdown(wait=False)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
