#!/usr/bin/env python3
"""The client side of scripts/compose-e2e.sh and scripts/compose-cluster.sh, run on the compose
network in the imagepipe/e2e-client image (python3, nats-py, confluent-kafka).

    compose_e2e.py smoke --via nats|kafka --run RUN [--samples DIR]
    compose_e2e.py load --via nats|kafka|http --run RUN --tasks N --out FILE [--samples DIR]
    compose_e2e.py check --run RUN --tasks N --events FILE [--timeout S]
    compose_e2e.py streams [--replicas R] [--summary]
    compose_e2e.py metrics --url http://HOST:8080/metrics

smoke  uploads two sample photos (POST /v1/blobs), then enqueues one as README's "Enqueue a task"
       says for the bus (a plain NATS publish on imagepipe.tasks.submit, or a Kafka produce to the
       topic imagepipe.tasks.submit keyed by the task id), with a `url` the download worker
       fetches from the coordinator (GET /v1/blobs/KEY), and the other by HTTP
       (POST /v1/tasks with {"blob": KEY}); watches GET /v1/events until both are
       task.completed, with their labels; reads both tasks (GET /v1/tasks/ID) and prints one
       JSON line: {"tasks": {ID: {"via", "labels", "keys": [blob keys of the derivatives],
       "top", "tags"}}}. Exit 1 with the reason otherwise.
load   watches GET /v1/events (every task.* event, one JSON line each to FILE) while it enqueues
       N tasks of run RUN (ids tsk_RUN_00000...), then keeps watching until killed (SIGTERM).
check  waits until GET /v1/tasks/ID shows every task of the run terminal, then asserts: every
       task completed (none lost, none failed), none completed twice (its history,
       GET /v1/tasks/ID/history, has exactly one transition to completed; and the task.completed
       events FILE recorded carry one event id per task: a repeated id is a redelivery of the
       same event, a second id would be a second completion). Prints a summary; exit 1 if not.
streams  prints the JetStream streams (name, replicas, leader, peers current) as JSON; with
       --replicas, exit 1 unless the three imagepipe streams have that many replicas, all current.
metrics  prints the totals of a service's message counters (handled by outcome, fetch errors,
       settle errors, abandoned) from its /metrics, one line.

The API is http://coordinator:8080 (--api), NATS nats://nats:4222 (--nats), Kafka kafka:9092
(--kafka): the compose services' own names.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

SUBMIT = "imagepipe.tasks.submit"
TERMINAL = {"task.completed", "task.failed", "task.cancelled"}


def log(*args):
    print("compose_e2e:", *args, file=sys.stderr, flush=True)


def decode(text):
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text.decode(errors="replace")


def http(method, url, body=None, content_type="application/json", timeout=30):
    data = body
    if isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("content-type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, decode(response.read())
    except urllib.error.HTTPError as e:
        return e.code, decode(e.read())


def wait_ready(api, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _ = http("GET", f"{api}/readyz", timeout=5)
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{api}/readyz did not answer 200 within {timeout} s")
        time.sleep(1)


def upload(api, path):
    with open(path, "rb") as f:
        status, body = http("POST", f"{api}/v1/blobs", f.read(), content_type="application/octet-stream")
    if status != 201:
        raise SystemExit(f"POST /v1/blobs {path}: {status} {body}")
    return body["key"]


class Watcher(threading.Thread):
    """GET /v1/events, every event of `selector` kept (and written to `out`, one JSON per line)."""

    def __init__(self, api, selector, out=None):
        super().__init__(daemon=True)
        query = urllib.parse.urlencode({"type": selector})
        self.url = f"{api}/v1/events?{query}"
        self.events = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.out = out
        self.error = None

    def run(self):
        # Reconnects: a coordinator replica may stop under the cluster test (the other one answers).
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=60) as response:
                    # The coordinator answers once its subscription is in place.
                    self.connected.set()
                    data = []
                    for raw in response:
                        line = raw.decode().rstrip("\r\n")
                        if line.startswith("data:"):
                            data.append(line[5:].lstrip())
                        elif not line and data:
                            self.keep(json.loads("\n".join(data)))
                            data = []
            except Exception as e:  # noqa: BLE001 - reconnect on anything, say why
                self.error = e
                log(f"event stream: {e}; reconnecting")
                time.sleep(1)

    def keep(self, event):
        with self.lock:
            self.events.append(event)
            if self.out:
                self.out.write(json.dumps(event) + "\n")
                self.out.flush()

    def snapshot(self):
        with self.lock:
            return list(self.events)


async def nats_publish(url, commands):
    import nats

    nc = await nats.connect(servers=url.split(","), connect_timeout=10)
    try:
        for command in commands:
            await nc.publish(SUBMIT, json.dumps(command).encode())
        await nc.flush(timeout=30)
    finally:
        await nc.close()


def kafka_produce(brokers, commands):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "acks": "all"})
    errors = []

    def delivered(err, _msg):
        if err is not None:
            errors.append(err)

    for command in commands:
        while True:
            try:
                producer.produce(SUBMIT, key=command["taskId"], value=json.dumps(command), on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    left = producer.flush(60)
    if left or errors:
        raise SystemExit(f"Kafka produce: {left} not delivered, errors {errors[:3]}")


def http_submit(api, commands):
    for i in range(0, len(commands), 1000):
        batch = commands[i : i + 1000]
        if len(batch) == 1:
            status, body = http("POST", f"{api}/v1/tasks", batch[0])
            if status != 202:
                raise SystemExit(f"POST /v1/tasks: {status} {body}")
        else:
            status, body = http("POST", f"{api}/v1/tasks:batch", {"tasks": batch}, timeout=120)
            if status != 200:
                raise SystemExit(f"POST /v1/tasks:batch: {status} {body}")


def enqueue(args, via, commands):
    if via == "nats":
        asyncio.run(nats_publish(args.nats, commands))
    elif via == "kafka":
        kafka_produce(args.kafka, commands)
    else:
        http_submit(args.api, commands)


def derivative_keys(task):
    metadata = (task.get("outputs") or {}).get("metadata") or {}
    keys = [d.get("key") for d in metadata.get("thumbnails") or [] if d.get("key")]
    if metadata.get("thumbnailKey") and metadata["thumbnailKey"] not in keys:
        keys.append(metadata["thumbnailKey"])
    return keys


def smoke(args):
    api = args.api
    wait_ready(api)
    photo_bus, photo_http = "coffee.jpg", "chelsea.jpg"
    key_bus = upload(api, os.path.join(args.samples, photo_bus))
    key_http = upload(api, os.path.join(args.samples, photo_http))
    log(f"uploaded {photo_bus} as {key_bus}, {photo_http} as {key_http}")

    watcher = Watcher(api, "task.completed || task.failed")
    watcher.start()
    if not watcher.connected.wait(60):
        raise SystemExit(f"GET /v1/events did not answer: {watcher.error}")

    bus_id, http_id = f"tsk_{args.run}_{args.via}", f"tsk_{args.run}_http"
    wanted = {
        bus_id: {
            "taskId": bus_id,
            "url": f"{api}/v1/blobs/{key_bus}",
            "labels": {"run": args.run, "via": args.via, "file": photo_bus},
        },
        http_id: {
            "taskId": http_id,
            "blob": key_http,
            "labels": {"run": args.run, "via": "http", "file": photo_http},
        },
    }
    started = time.monotonic()
    enqueue(args, args.via, [wanted[bus_id]])
    log(f"{bus_id}: enqueued by {args.via} ({wanted[bus_id]['url']})")
    enqueue(args, "http", [wanted[http_id]])
    log(f"{http_id}: enqueued by POST /v1/tasks (blob {key_http})")

    seen = {}
    deadline = time.monotonic() + args.timeout
    while len(seen) < len(wanted):
        for event in watcher.snapshot():
            task_id = event.get("taskId")
            if task_id in wanted and task_id not in seen:
                if event["eventType"] != "task.completed":
                    raise SystemExit(f"{task_id}: {event['eventType']}: {json.dumps(event.get('payload'))}")
                labels = (event.get("payload") or {}).get("labels")
                if labels != wanted[task_id]["labels"]:
                    raise SystemExit(f"{task_id}: task.completed with labels {labels}, submitted {wanted[task_id]['labels']}")
                seen[task_id] = time.monotonic() - started
                log(f"{task_id}: task.completed after {seen[task_id]:.1f} s, labels {labels}")
        if time.monotonic() > deadline:
            missing = sorted(set(wanted) - set(seen))
            states = {t: http("GET", f"{api}/v1/tasks/{t}")[1] for t in missing}
            raise SystemExit(f"no task.completed within {args.timeout} s for {missing}: {json.dumps(states)[:2000]}")
        time.sleep(0.2)

    report = {}
    for task_id, command in wanted.items():
        status, task = http("GET", f"{api}/v1/tasks/{task_id}")
        if status != 200 or task.get("state") != "completed":
            raise SystemExit(f"GET /v1/tasks/{task_id}: {status} {task}")
        analysis = (task.get("outputs") or {}).get("analysis") or {}
        top = ((analysis.get("predictions") or [{}])[0]).get("label")
        tags = [t.get("label") for t in analysis.get("tags") or []]
        keys = derivative_keys(task)
        if not keys:
            raise SystemExit(f"{task_id}: no thumbnail in {json.dumps(task.get('outputs'))[:1000]}")
        report[task_id] = {
            "via": command["labels"]["via"],
            "file": command["labels"]["file"],
            "labels": task.get("labels"),
            "keys": keys,
            "top": top,
            "tags": tags,
            "seconds": round(seen[task_id], 2),
        }
    if "cat" not in report[http_id]["tags"]:
        raise SystemExit(f"{http_id}: chelsea.jpg is not tagged cat: {report[http_id]}")
    if report[bus_id]["top"] != "espresso":
        raise SystemExit(f"{bus_id}: coffee.jpg's top label is {report[bus_id]['top']}, not espresso")
    print(json.dumps({"tasks": report}), flush=True)


def load(args):
    api = args.api
    wait_ready(api)
    samples = sorted(f for f in os.listdir(args.samples) if f.endswith(".jpg"))
    keys = [upload(api, os.path.join(args.samples, f)) for f in samples]
    out = open(args.out, "a", encoding="utf-8")
    watcher = Watcher(api, "task.*", out)
    watcher.start()
    if not watcher.connected.wait(60):
        raise SystemExit(f"GET /v1/events did not answer: {watcher.error}")
    commands = [
        {
            "taskId": f"tsk_{args.run}_{i:05d}",
            "blob": keys[i % len(keys)],
            "labels": {"run": args.run, "file": samples[i % len(samples)]},
        }
        for i in range(args.tasks)
    ]
    started = time.monotonic()
    enqueue(args, args.via, commands)
    log(f"{len(commands)} tasks enqueued by {args.via} in {time.monotonic() - started:.1f} s")
    # Keeps recording until told to stop.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1):
        pass
    out.close()


def check(args):
    api = args.api
    ids = [f"tsk_{args.run}_{i:05d}" for i in range(args.tasks)]
    deadline = time.monotonic() + args.timeout
    states = {}
    errors = {}
    while True:
        pending = [i for i in ids if states.get(i) not in ("completed", "failed", "cancelled")]
        for task_id in pending:
            try:
                status, task = http("GET", f"{api}/v1/tasks/{task_id}", timeout=10)
            except OSError as e:
                log(f"GET /v1/tasks/{task_id}: {e}")
                break
            states[task_id] = task.get("state") if status == 200 else f"http {status}"
            if status == 200 and task.get("state") in ("failed", "cancelled"):
                errors[task_id] = task.get("lastError")
        pending = [i for i in ids if states.get(i) not in ("completed", "failed", "cancelled")]
        if not pending or time.monotonic() > deadline:
            break
        log(f"{len(ids) - len(pending)}/{len(ids)} terminal; waiting")
        time.sleep(5)

    twice_in_history = {}
    for task_id in ids:
        if states.get(task_id) != "completed":
            continue
        status, history = http("GET", f"{api}/v1/tasks/{task_id}/history", timeout=10)
        entries = history.get("entries", []) if status == 200 else []
        completed = sum(1 for e in entries if e.get("to") == "completed")
        if completed != 1:
            twice_in_history[task_id] = completed

    completions = {}
    events = 0
    with open(args.events, encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            events += 1
            if event.get("eventType") == "task.completed" and event.get("taskId", "").startswith(f"tsk_{args.run}_"):
                completions.setdefault(event["taskId"], set()).add(event["eventId"])
    by_state = {}
    for task_id in ids:
        by_state.setdefault(states.get(task_id, "unknown"), []).append(task_id)
    twice = {t: sorted(e) for t, e in completions.items() if len(e) > 1}
    not_completed = [t for t in ids if states.get(t) != "completed"]
    no_event = [t for t in ids if states.get(t) == "completed" and t not in completions]
    summary = {
        "tasks": len(ids),
        "states": {s: len(t) for s, t in by_state.items()},
        "completedEvents": sum(len(e) for e in completions.values()),
        "eventsRecorded": events,
        "notCompleted": not_completed[:20],
        "notCompletedErrors": dict(list(errors.items())[:5]),
        "completedTwice": dict(list(twice.items())[:20]),
        "completedWithoutEvent": no_event[:20],
        "historyCompletedNotOnce": dict(list(twice_in_history.items())[:20]),
    }
    print(json.dumps(summary), flush=True)
    if not_completed or twice or twice_in_history:
        sys.exit(1)


async def stream_report(url):
    import nats

    nc = await nats.connect(servers=url.split(","), connect_timeout=10)
    try:
        js = nc.jetstream()
        report = {}
        for name in ("IMAGEPIPE_TASKS", "IMAGEPIPE_EVENTS", "IMAGEPIPE_DLQ"):
            info = await js.stream_info(name)
            cluster = info.cluster
            report[name] = {
                "replicas": info.config.num_replicas,
                "leader": cluster.leader if cluster else None,
                "replicasCurrent": [r.name for r in (cluster.replicas or []) if r.current] if cluster else [],
                "messages": info.state.messages,
            }
        # What the task queues' consumers redelivered (an ack that did not come in time).
        redelivered = {}
        for consumer in await js.consumers_info("IMAGEPIPE_TASKS"):
            redelivered[consumer.name] = consumer.num_redelivered
        report["IMAGEPIPE_TASKS"]["redelivered"] = redelivered
        return report
    finally:
        await nc.close()


def streams(args):
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            report = asyncio.run(stream_report(args.nats))
        except Exception as e:  # noqa: BLE001 - the streams may not exist yet
            report = {"error": str(e)}
        ok = "error" not in report and all(
            s["replicas"] == args.replicas and s["leader"] and len(s["replicasCurrent"]) == args.replicas - 1
            for s in report.values()
        )
        if args.summary and "error" not in report:
            leaders = ", ".join(f"{name} led by {s['leader']}" for name, s in report.items())
            redelivered = {k: v for k, v in report["IMAGEPIPE_TASKS"]["redelivered"].items() if v}
            print(f"{leaders}; redelivered so far: {redelivered or 'none'}", flush=True)
            return
        if not args.replicas or ok or time.monotonic() > deadline:
            print(json.dumps(report), flush=True)
            if args.replicas and not ok:
                sys.exit(1)
            return
        time.sleep(2)


def metrics(args):
    with urllib.request.urlopen(args.url, timeout=10) as response:
        text = response.read().decode()
    totals = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name not in ("imagepipe_messages_handled_total", "imagepipe_fetch_errors_total",
                        "imagepipe_settle_errors_total", "imagepipe_messages_abandoned_total"):
            continue
        key = name.removeprefix("imagepipe_").removesuffix("_total")
        if name == "imagepipe_messages_handled_total" and 'outcome="' in name_labels:
            key += ":" + name_labels.split('outcome="', 1)[1].split('"', 1)[0]
        totals[key] = totals.get(key, 0) + float(value)
    print(", ".join(f"{k} {int(v)}" for k, v in sorted(totals.items())) or "no message counters", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["smoke", "load", "check", "streams", "metrics"])
    parser.add_argument("--url", help="metrics: the /metrics URL")
    parser.add_argument("--via", choices=["nats", "kafka", "http"], default="nats")
    parser.add_argument("--run", required=True, help="run id: task ids are tsk_RUN_...")
    parser.add_argument("--api", default="http://coordinator:8080")
    parser.add_argument("--nats", default="nats://nats:4222")
    parser.add_argument("--kafka", default="kafka:9092")
    parser.add_argument("--samples", default="/samples")
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--out", help="load: file the events are appended to")
    parser.add_argument("--events", help="check: the file load wrote")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--replicas", type=int, default=0, help="streams: the replicas every stream must have")
    parser.add_argument("--summary", action="store_true", help="streams: one line, leaders and redeliveries")
    args = parser.parse_args()
    if args.command == "metrics":
        return metrics(args)
    {"smoke": smoke, "load": load, "check": check, "streams": streams}[args.command](args)


if __name__ == "__main__":
    main()
