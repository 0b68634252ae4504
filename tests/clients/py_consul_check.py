"""Drive `leaderq server` with py-consul, the maintained Python Consul client, exactly as a
user would drive a real Consul agent: KV, sessions, locks, blocking reads, txn, TTL checks.

Usage: CONSUL_HTTP_ADDR=127.0.0.1:8500 python3 tests/clients/py_consul_check.py
Exits non-zero on the first behaviour that differs from Consul's.
"""

import base64
import os
import threading
import time

import consul

host, port = os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500").split(":")
c = consul.Consul(host=host, port=int(port))
checks_run = 0


def check(name, condition):
    global checks_run
    if not condition:
        raise SystemExit(f"FAIL: {name}")
    checks_run += 1
    print(f"ok   {name}")


# Agent and status: what clients probe first.
me = c.agent.self()
check("agent self reports dc1", me["Config"]["Datacenter"] == "dc1")
check("status leader is an address", ":" in c.status.leader())

# KV basics.
check("kv put", c.kv.put("py/hello", "world") is True)
index, entry = c.kv.get("py/hello")
check("kv get value", entry["Value"] == b"world")
check("kv get index", index == str(entry["ModifyIndex"]))
check("kv flags", c.kv.put("py/flags", "x", flags=42) and c.kv.get("py/flags")[1]["Flags"] == 42)
check("kv cas create-only refuses existing", c.kv.put("py/hello", "again", cas=0) is False)
check("kv cas on index", c.kv.put("py/hello", "cas", cas=entry["ModifyIndex"]) is True)
_, listing = c.kv.get("py/", recurse=True)
check("kv recurse", [e["Key"] for e in listing] == ["py/flags", "py/hello"])
_, keys = c.kv.get("py/", keys=True)
check("kv keys", keys == ["py/flags", "py/hello"])
check("kv missing key is None", c.kv.get("py/missing")[1] is None)
check("kv delete", c.kv.delete("py/flags") is True and c.kv.get("py/flags")[1] is None)

# Blocking read wakes on a change.
index, _ = c.kv.get("py/hello")
threading.Timer(0.3, lambda: c.kv.put("py/hello", "changed")).start()
started = time.time()
new_index, entry = c.kv.get("py/hello", index=index, wait="10s")
check("blocking get wakes on write", entry["Value"] == b"changed" and int(new_index) > int(index))
check("blocking get did not time out", time.time() - started < 5)

# Sessions and locks.
a = c.session.create(name="py-a", ttl=10, lock_delay=0)
b = c.session.create(name="py-b", ttl=10)
check("session info", c.session.info(a)[1]["Name"] == "py-a")
check("session renew", c.session.renew(a)["ID"] == a)
check("session list", {a, b} <= {s["ID"] for s in c.session.list()[1]})
check("acquire", c.kv.put("py/leader", "a", acquire=a) is True)
check("contender refused", c.kv.put("py/leader", "b", acquire=b) is False)
check("lock holder visible", c.kv.get("py/leader")[1]["Session"] == a)
check("release", c.kv.put("py/leader", "a", release=a) is True)
check("contender acquires after release", c.kv.put("py/leader", "b", acquire=b) is True)
check("lock index counts holders", c.kv.get("py/leader")[1]["LockIndex"] == 2)
check("destroy", c.session.destroy(b) is True)
check("destroy releases lock", "Session" not in c.kv.get("py/leader")[1])
check("lock-delay after destroy", c.kv.put("py/leader", "a", acquire=a) is False)

# Transactions.
enc = lambda s: base64.b64encode(s.encode()).decode()
result = c.txn.put([
    {"KV": {"Verb": "set", "Key": "py/t1", "Value": enc("1")}},
    {"KV": {"Verb": "set", "Key": "py/t2", "Value": enc("2")}},
    {"KV": {"Verb": "get", "Key": "py/t1"}},
])
check("txn commits", result["Errors"] is None and len(result["Results"]) == 3)
check("txn get returns value", base64.b64decode(result["Results"][2]["KV"]["Value"]) == b"1")
try:
    c.txn.put([
        {"KV": {"Verb": "set", "Key": "py/t3", "Value": enc("3")}},
        {"KV": {"Verb": "check-index", "Key": "py/t1", "Index": 1}},
    ])
    failed = None
except consul.ConsulException as err:
    failed = str(err)
check("failed txn is reported", failed is not None and "409" in failed)
check("failed txn applied nothing", c.kv.get("py/t3")[1] is None)

# TTL checks bound to sessions.
check("register ttl check", c.agent.check.register("py-worker", check=consul.Check.ttl("10s")) is True)
check("ttl pass", c.agent.check.ttl_pass("py-worker") is True)
check("check listed", c.agent.checks()["py-worker"]["Status"] == "passing")
bound = c.session.create(name="py-bound", checks=["serfHealth", "py-worker"], lock_delay=0)
check("bound session lock", c.kv.put("py/job", "x", acquire=bound) is True)
check("ttl fail", c.agent.check.ttl_fail("py-worker") is True)
check("failing check destroys session", c.session.info(bound)[1] is None)
check("failing check releases lock", "Session" not in c.kv.get("py/job")[1])
check("deregister check", c.agent.check.deregister("py-worker") is True)

# Services: the agent's registration with a TTL check, the catalog, health, maintenance.
check(
    "register service",
    c.agent.service.register(
        "py-web", service_id="py-web-1", port=8080, tags=["blue"], check=consul.Check.ttl("10s")
    )
    is True,
)
c.agent.service.register("py-web", service_id="py-web-2", port=8081, tags=["green"], check=consul.Check.ttl("10s"))
check("agent services", sorted(c.agent.services()) == ["py-web-1", "py-web-2"])
check("service check starts critical", c.agent.checks()["service:py-web-1"]["Status"] == "critical")
check("pass service check", c.agent.check.ttl_pass("service:py-web-1") is True)
_, services = c.catalog.services()
check("catalog services", services.get("py-web") == ["blue", "green"] and "consul" in services)
_, nodes = c.catalog.service("py-web", tag="green")
check("catalog service by tag", [n["ServiceID"] for n in nodes] == ["py-web-2"])
index, healthy = c.health.service("py-web", passing=True)
check("health passing", [n["Service"]["ID"] for n in healthy] == ["py-web-1"])
threading.Timer(0.3, lambda: c.agent.check.ttl_pass("service:py-web-2")).start()
started = time.time()
_, healthy = c.health.service("py-web", passing=True, index=index, wait="10s")
check("blocking health wakes", len(healthy) == 2 and time.time() - started < 5)
_, critical = c.health.state("critical")
check("health state", all(ch["Status"] == "critical" for ch in critical))
check("service maintenance", c.agent.service.maintenance("py-web-1", "true", reason="deploy") is True)
_, healthy = c.health.service("py-web", passing=True)
check("maintenance leaves passing", [n["Service"]["ID"] for n in healthy] == ["py-web-2"])
c.agent.service.maintenance("py-web-1", "false")
check("node maintenance", c.agent.maintenance("true") is True)
check("node maintenance fails all", c.health.service("py-web", passing=True)[1] == [])
c.agent.maintenance("false")
check("members", c.agent.members()[0]["Status"] == 1)
check("deregister service", c.agent.service.deregister("py-web-2") is True)
check("deregistered", "py-web-2" not in c.agent.services())
c.agent.service.deregister("py-web-1")

# User events.
fired = c.event.fire("py-deploy", "v1")
check("event fire", fired["Name"] == "py-deploy" and len(fired["ID"]) == 36)
index, events = c.event.list(name="py-deploy")
check("event list", [e["ID"] for e in events] == [fired["ID"]] and events[0]["Payload"] == b"v1")

check("recursive delete", c.kv.delete("py/", recurse=True) is True and c.kv.get("py/", recurse=True)[1] is None)
c.session.destroy(a)
print(f"{checks_run} passed, 0 failed")
