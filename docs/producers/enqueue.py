#!/usr/bin/env python3
"""Enqueue tasks through leaderq's front door (`leaderq gateway`), standard library only.

LEADERQ_GATEWAY is the gateway's base URL (default http://127.0.0.1:9465) and
LEADERQ_GATEWAY_TOKEN its token (gateway.token). See docs/producers.md; CI runs this file
against a live gateway (tests/consumer/gateway.rs).
"""

import json
import os
import time
import urllib.error
import urllib.request

BASE = os.environ.get("LEADERQ_GATEWAY", "http://127.0.0.1:9465")
TOKEN = os.environ.get("LEADERQ_GATEWAY_TOKEN", "")


def call(method, path, body=None, key=None):
    """One request; returns (status, decoded JSON answer). 4xx/5xx answers are returned too."""
    headers = {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def enqueue(task, key):
    """One task, created only if `key` is new: 201 when written, 200 for a replay."""
    status, answer = call("POST", "/v1/tasks", task, key=key)
    if status not in (200, 201):
        # 4xx: the answer names the field ("field") and says what to fix ("error").
        raise RuntimeError(f"refused ({status}): {answer}")
    return status, answer


def main():
    task = {"taskType": "email", "taskTime": int(time.time()), "taskPara": {"to": "a@example.com"}}
    status, answer = enqueue(task, key="order-1001")
    assert status == 201, answer
    # A retry after a timeout is safe: the same key writes nothing and answers the stored task.
    status, answer = enqueue(task, key="order-1001")
    assert status == 200 and answer["created"] is False, answer

    # Bulk: an array; each task's key is task_<taskId>. The answer lists what was written
    # and what was refused (a key that exists).
    batch = [{"taskType": "email", "taskTime": int(time.time()), "taskId": f"batch-{n}"}
             for n in range(3)]
    status, answer = call("POST", "/v1/tasks", batch)
    assert status == 200 and len(answer["written"]) == 3, answer

    status, answer = call("GET", "/v1/tasks/order-1001")
    assert status == 200, answer
    print(answer["key"], answer["state"], "attempts:", answer["attempts"])

    # A task the leader would dead-letter is refused before anything is written.
    status, answer = call("POST", "/v1/tasks", {"taskType": "email"})
    assert status == 422 and answer["field"] == "taskTime", answer


if __name__ == "__main__":
    main()
