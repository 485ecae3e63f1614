"""Checks of imagepipe's message contract with other languages' tools (the venv of
scripts/contract-tools.sh). Run by the Rust tests, never by hand in CI:

  contract_check.py cloudevents CASES.json [ASYNCAPI.json]
      CASES.json: a list of raw messages read back from a broker, each
      {"name", "binding": "kafka" | "nats", "headers": {name: value}, "key", "body" (text),
       "expect": {"id", "type", "source", "time" (RFC 3339), "subject"}, "message" (the
       AsyncAPI message component it is)}.
      Each is read with the CloudEvents Python SDK in binary content mode (Kafka: the Kafka
      binding; NATS: the ce-* headers through the HTTP binding, which names them the same) with
      both of its APIs, and must give the expected id, type, source, specversion, time, subject,
      datacontenttype and the body as data. Then the same messages with a wrong header each
      must fail the comparison (so the check can fail). With the AsyncAPI document, the headers
      and the body must also fit the message's `headers` and `payload` schemas there.

  contract_check.py asyncapi DOCUMENT.json GOLDEN.json
      Validates every golden message (GOLDEN.json: [{"file", "body", "address"}]) against the
      payload schemas of the messages of its channel (by address) in the AsyncAPI document:
      exactly one must accept it, and none accepts `{}`.

Prints what it checked; exits 1 with the reasons when a check fails.
"""

import copy
import json
import sys
from datetime import datetime


def fail(problems):
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    sys.exit(1)


def parse_time(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def read_core(case):
    """The event as the SDK's current API (cloudevents.core.bindings) reads it."""
    from cloudevents.core.formats.json import JSONFormat

    body = case["body"].encode("utf-8")
    if case["binding"] == "kafka":
        from cloudevents.core.bindings import kafka

        headers = {k: v.encode("utf-8") for k, v in case["headers"].items()}
        event = kafka.from_binary(kafka.KafkaMessage(headers=headers, key=case.get("key"), value=body), JSONFormat())
    else:
        from cloudevents.core.bindings import http

        event = http.from_binary(http.HTTPMessage(headers=dict(case["headers"]), body=body), JSONFormat())
    time = event.get_time()
    return {
        "id": event.get_id(),
        "type": event.get_type(),
        "source": event.get_source(),
        "specversion": event.get_specversion(),
        "time": time,
        "subject": event.get_subject(),
        "datacontenttype": event.get_datacontenttype(),
        "data": event.get_data(),
    }


def read_legacy(case):
    """The event as the SDK's v1 API reads it (cloudevents.kafka.from_binary and
    cloudevents.http.from_http before 2.0, now under cloudevents.v1)."""
    body = case["body"].encode("utf-8")
    if case["binding"] == "kafka":
        from cloudevents.v1 import kafka

        headers = {k: v.encode("utf-8") for k, v in case["headers"].items()}
        event = kafka.from_binary(kafka.KafkaMessage(headers=headers, key=case.get("key"), value=body))
    else:
        from cloudevents.v1.http import from_http

        event = from_http(dict(case["headers"]), body)
    attributes = event.get_attributes()
    return {
        "id": attributes.get("id"),
        "type": attributes.get("type"),
        "source": attributes.get("source"),
        "specversion": attributes.get("specversion"),
        "time": parse_time(attributes["time"]) if attributes.get("time") else None,
        "subject": attributes.get("subject"),
        "datacontenttype": attributes.get("datacontenttype"),
        "data": event.get_data(),
    }


def compare(case, read):
    """The differences between what `read` makes of `case` and what it should be."""
    try:
        got = read(case)
    except Exception as error:  # the SDK refusing the message is a difference too
        return [f"{case['name']}: the SDK refused it: {type(error).__name__}: {error}"]
    expect = case["expect"]
    want = {
        "id": expect["id"],
        "type": expect["type"],
        "source": expect["source"],
        "specversion": "1.0",
        "time": parse_time(expect["time"]),
        "subject": expect.get("subject"),
        "datacontenttype": "application/json",
        "data": json.loads(case["body"]),
    }
    return [
        f"{case['name']} ({read.__name__}): {field} is {got[field]!r}, expected {value!r}"
        for field, value in want.items()
        if got[field] != value
    ]


def wrong_headers(case):
    """Copies of `case` whose headers are each wrong in one way the check must catch."""
    prefix = "ce_" if case["binding"] == "kafka" else "ce-"
    for name, change in [
        ("id", lambda h: h.update({f"{prefix}id": h[f"{prefix}id"] + "x"})),
        ("type", lambda h: h.update({f"{prefix}type": "image.other"})),
        ("source", lambda h: h.update({f"{prefix}source": "/elsewhere"})),
        ("time", lambda h: h.update({f"{prefix}time": "2001-01-01T00:00:00Z"})),
        ("no-id", lambda h: h.pop(f"{prefix}id")),
        ("other-binding", lambda h: [h.update({other(k): h.pop(k)}) for k in list(h) if k.startswith(prefix)]),
    ]:
        wrong = copy.deepcopy(case)
        change(wrong["headers"])
        wrong["name"] = f"{case['name']} with a wrong {name}"
        yield wrong


def other(name):
    return "ce-" + name[3:] if name.startswith("ce_") else "ce_" + name[3:]


def in_document(document, schema, instance):
    """The errors of `instance` against `schema`, whose $refs point into the AsyncAPI document."""
    import jsonschema

    root = {"$ref": "#/checked", "checked": schema, "components": document["components"]}
    return [e.message[:300] for e in jsonschema.Draft202012Validator(root).iter_errors(instance)]


def cloudevents_check(path, document_path=None):
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    if not cases:
        fail(["no messages to check"])
    document = None
    if document_path:
        with open(document_path, encoding="utf-8") as f:
            document = json.load(f)
    problems = []
    for case in cases:
        if document is not None:
            message = document["components"]["messages"][case["message"]]
            for part, schema, instance in [
                ("headers", message["headers"], case["headers"]),
                ("body", message["payload"], json.loads(case["body"])),
            ]:
                problems += [f"{case['name']}: {part} against {case['message']}: {e}" for e in in_document(document, schema, instance)]
            wrong = dict(case["headers"])
            wrong.pop("ce_type" if case["binding"] == "kafka" else "ce-type")
            if not in_document(document, message["headers"], wrong):
                problems.append(f"{case['name']}: headers without the type fit {case['message']}")
        for read in (read_core, read_legacy):
            problems += compare(case, read)
        for wrong in wrong_headers(case):
            for read in (read_core, read_legacy):
                if not compare(wrong, read):
                    problems.append(f"{wrong['name']} ({read.__name__}) passed the check")
    if problems:
        fail(problems)
    import cloudevents

    print(f"{len(cases)} messages are CloudEvents to the cloudevents SDK {cloudevents.__version__}")


def asyncapi_check(document_path, golden_path):
    import jsonschema

    with open(document_path, encoding="utf-8") as f:
        document = json.load(f)
    with open(golden_path, encoding="utf-8") as f:
        golden = json.load(f)
    problems = []

    def resolve(ref):
        node = document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def payload_validator(message):
        # The payload schema resolved inside the document: its $refs point at #/components/schemas.
        schema = {"$ref": "#/payload", "payload": message["payload"], "components": document["components"]}
        return jsonschema.Draft202012Validator(schema)

    channels = {c["address"]: c for c in document["channels"].values()}
    for entry in golden:
        channel = channels.get(entry["address"])
        if channel is None:
            problems.append(f"{entry['file']}: no channel at {entry['address']}")
            continue
        messages = [resolve(m["$ref"]) if "$ref" in m else m for m in channel["messages"].values()]
        accepting = [m["name"] for m in messages if payload_validator(m).is_valid(entry["body"])]
        if len(accepting) != 1:
            reasons = [
                f"{m['name']}: {e.message[:200]}"
                for m in messages
                for e in list(payload_validator(m).iter_errors(entry["body"]))[:1]
            ]
            problems.append(f"{entry['file']} on {entry['address']}: accepted by {accepting} ({reasons})")
        if any(payload_validator(m).is_valid({}) for m in messages):
            problems.append(f"{entry['address']}: a message accepts an empty object")
    if problems:
        fail(problems)
    print(f"{len(golden)} golden messages each fit one message of their channel in the AsyncAPI document")


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "cloudevents":
        cloudevents_check(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "asyncapi":
        asyncapi_check(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
