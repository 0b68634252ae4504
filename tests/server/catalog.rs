//! The service catalog over HTTP: agent service registration with TTL checks, the agent's
//! services and members, catalog and health reads (blocking, `?passing`, `?tag`),
//! maintenance mode, user events, and services across a restart.

use super::*;

async fn register(server: &ServerProcess, body: Value) -> reqwest::Response {
    put(server, "/v1/agent/service/register", &body.to_string()).await
}

async fn json_of(server: &ServerProcess, path: &str) -> Value {
    let answer = get(server, path).await;
    assert_eq!(answer.status(), 200, "{path}");
    answer.json().await.unwrap()
}

fn ids(instances: &Value) -> Vec<&str> {
    instances
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["Service"]["ID"].as_str().unwrap())
        .collect()
}

/// A registration with a TTL check shows in `/v1/agent/services` with Consul's fields and
/// defaults (tagged addresses from the address, weights 1/1), and its check in
/// `/v1/agent/checks` with the service's name and tags, critical until it is passed.
#[tokio::test]
async fn registered_service_shows_in_the_agent_with_consuls_shape() {
    let server = ServerProcess::start();
    let answer = register(
        &server,
        json!({
            "ID": "web1", "Name": "web", "Tags": ["b", "a"], "Address": "10.0.0.7",
            "Port": 8080, "Meta": {"version": "2"},
            "Check": {"TTL": "30s", "Notes": "keepalive"}
        }),
    )
    .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "");
    let services = json_of(&server, "/v1/agent/services").await;
    assert_eq!(
        services,
        json!({"web1": {
            "ID": "web1", "Service": "web", "Tags": ["b", "a"], "Meta": {"version": "2"},
            "Port": 8080, "Address": "10.0.0.7",
            "TaggedAddresses": {
                "lan_ipv4": {"Address": "10.0.0.7", "Port": 8080},
                "wan_ipv4": {"Address": "10.0.0.7", "Port": 8080}
            },
            "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": false,
            "Datacenter": "dc1"
        }})
    );
    let checks = json_of(&server, "/v1/agent/checks").await;
    let check = &checks["service:web1"];
    assert_eq!(check["Status"], "critical");
    assert_eq!(check["Name"], "Service 'web' check");
    assert_eq!(check["ServiceID"], "web1");
    assert_eq!(check["ServiceName"], "web");
    assert_eq!(check["ServiceTags"], json!(["b", "a"]));
    assert_eq!(check["Notes"], "keepalive");
    assert_eq!(check["Type"], "ttl");
    assert_eq!(
        put(&server, "/v1/agent/check/pass/service:web1", "")
            .await
            .status(),
        200
    );
    let checks = json_of(&server, "/v1/agent/checks").await;
    assert_eq!(checks["service:web1"]["Status"], "passing");
}

/// Registration errors are Consul's: 400 for a missing name, a bad check status, a check
/// without TTL, an address that names every interface; 404 for deregistering an unknown
/// id; a check may name an existing service.
#[tokio::test]
async fn registration_errors_are_consuls() {
    let server = ServerProcess::start();
    for (body, text) in [
        (json!({"ID": "x"}), "Missing service name"),
        (
            json!({"Name": "x", "Address": "0.0.0.0"}),
            "Invalid service address",
        ),
        (
            json!({"Name": "x", "Check": {"TTL": "10s", "Status": "bad"}}),
            "Status for checks must 'passing', 'warning', 'critical'",
        ),
        (
            json!({"Name": "x", "Checks": [{"Notes": "no ttl"}]}),
            "Invalid check: TTL must be > 0 for TTL checks",
        ),
    ] {
        let answer = register(&server, body.clone()).await;
        assert_eq!(answer.status(), 400, "{body}");
        assert_eq!(answer.text().await.unwrap(), text, "{body}");
    }
    let unknown = put(&server, "/v1/agent/service/deregister/nope", "").await;
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        unknown.text().await.unwrap(),
        "Unknown service ID \"nope\". Ensure that the service ID is passed, not the service name."
    );
    assert_eq!(register(&server, json!({"Name": "db"})).await.status(), 200);
    let check = put(
        &server,
        "/v1/agent/check/register",
        &json!({"Name": "db-ttl", "TTL": "10s", "ServiceID": "db", "Status": "passing"})
            .to_string(),
    )
    .await;
    assert_eq!(check.status(), 200);
    let health = json_of(&server, "/v1/health/service/db").await;
    let check_ids: Vec<&str> = health[0]["Checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["CheckID"].as_str().unwrap())
        .collect();
    assert_eq!(check_ids, vec!["serfHealth", "db-ttl"]);
    assert_eq!(
        put(&server, "/v1/agent/service/deregister/db", "")
            .await
            .status(),
        200
    );
    assert!(json_of(&server, "/v1/agent/checks")
        .await
        .get("db-ttl")
        .is_none());
}

/// `/v1/catalog/services` lists every service name with its tags (the server's own
/// `consul` service included); `/v1/catalog/service/<name>` gives Consul's ServiceNode
/// shape, filtered by `?tag`; both carry the index and the effective consistency.
#[tokio::test]
async fn catalog_lists_services_and_their_nodes() {
    let server = ServerProcess::start();
    register(
        &server,
        json!({"ID": "w1", "Name": "web", "Tags": ["v1", "blue"], "Port": 81}),
    )
    .await;
    register(
        &server,
        json!({"ID": "w2", "Name": "web", "Tags": ["v2"], "Port": 82}),
    )
    .await;
    let answer = get(&server, "/v1/catalog/services").await;
    assert_eq!(answer.headers()["X-Consul-Effective-Consistency"], "leader");
    let index = index_of(&answer);
    assert!(index > 1);
    let services: Value = answer.json().await.unwrap();
    assert_eq!(services, json!({"consul": [], "web": ["blue", "v1", "v2"]}));

    let nodes = json_of(&server, "/v1/catalog/service/web").await;
    assert_eq!(nodes.as_array().unwrap().len(), 2);
    let first = &nodes[0];
    assert_eq!(first["Node"], "test-node");
    assert_eq!(first["Datacenter"], "dc1");
    assert_eq!(first["ServiceID"], "w1");
    assert_eq!(first["ServiceName"], "web");
    assert_eq!(first["ServiceTags"], json!(["v1", "blue"]));
    assert_eq!(first["ServicePort"], 81);
    assert_eq!(first["ServiceAddress"], "");
    assert_eq!(first["ServiceWeights"], json!({"Passing": 1, "Warning": 1}));
    assert_eq!(
        first["ServiceProxy"],
        json!({"Mode": "", "MeshGateway": {}, "Expose": {}})
    );
    assert!(first["CreateIndex"].as_u64().unwrap() > 0);
    let tagged = json_of(&server, "/v1/catalog/service/web?tag=v2").await;
    assert_eq!(tagged.as_array().unwrap().len(), 1);
    assert_eq!(tagged[0]["ServiceID"], "w2");
    assert_eq!(
        json_of(&server, "/v1/catalog/service/none").await,
        json!([])
    );
    let consul = json_of(&server, "/v1/catalog/service/consul").await;
    assert_eq!(consul[0]["ServicePort"], 8300);
}

/// `/v1/health/service/<name>` gives each instance with its node's and its own checks;
/// `?passing` keeps those whose checks all pass; a blocking read returns when a check of
/// the service changes, with a higher index.
#[tokio::test]
async fn health_service_filters_passing_and_blocks() {
    let server = ServerProcess::start();
    for id in ["a", "b"] {
        let answer = register(
            &server,
            json!({"ID": id, "Name": "app", "Tags": [id], "Check": {"CheckID": format!("ttl-{id}"), "TTL": "30s"}}),
        )
        .await;
        assert_eq!(answer.status(), 200);
    }
    let all = get(&server, "/v1/health/service/app").await;
    assert_eq!(all.headers()["X-Consul-Effective-Consistency"], "leader");
    let index = index_of(&all);
    let all: Value = all.json().await.unwrap();
    assert_eq!(ids(&all), vec!["a", "b"]);
    assert_eq!(all[0]["Node"]["Node"], "test-node");
    assert_eq!(all[0]["Checks"][0]["CheckID"], "serfHealth");
    assert_eq!(all[0]["Checks"][1]["CheckID"], "ttl-a");
    assert_eq!(all[0]["Checks"][1]["ServiceTags"], json!(["a"]));
    assert_eq!(all[0]["Service"]["Tags"], json!(["a"]));
    assert_eq!(
        json_of(&server, "/v1/health/service/app?passing").await,
        json!([])
    );

    let url = server.url(&format!(
        "/v1/health/service/app?passing&index={index}&wait=10s"
    ));
    let waiter = tokio::spawn(async move { client().get(url).send().await.unwrap() });
    wait_until_blocked(&server.addr, 1).await;
    assert!(!waiter.is_finished(), "the blocking read returned at once");
    put(&server, "/v1/agent/check/pass/ttl-b", "").await;
    let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the blocking read woke")
        .unwrap();
    assert!(index_of(&woke) > index);
    let passing: Value = woke.json().await.unwrap();
    assert_eq!(ids(&passing), vec!["b"]);
    assert_eq!(
        ids(&json_of(&server, "/v1/health/service/app?passing=true&tag=b").await),
        vec!["b"]
    );
    assert_eq!(
        json_of(&server, "/v1/health/service/app?tag=b&tag=a").await,
        json!([])
    );
    let bad = get(&server, "/v1/health/service/app?passing=maybe").await;
    assert_eq!(bad.status(), 400);
    assert_eq!(bad.text().await.unwrap(), "Invalid value for ?passing");
}

/// `/v1/health/state/<state>` lists the checks in that state (`any` for all), with the
/// checks table's index.
#[tokio::test]
async fn health_state_lists_checks_by_status() {
    let server = ServerProcess::start();
    register(
        &server,
        json!({"ID": "a", "Name": "app", "Checks": [{"CheckID": "one", "TTL": "30s"}, {"CheckID": "two", "TTL": "30s", "Status": "passing"}]}),
    )
    .await;
    let check_ids = |checks: &Value| -> Vec<String> {
        checks
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["CheckID"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        check_ids(&json_of(&server, "/v1/health/state/critical").await),
        vec!["one"]
    );
    assert_eq!(
        check_ids(&json_of(&server, "/v1/health/state/passing").await),
        vec!["serfHealth", "two"]
    );
    assert_eq!(
        check_ids(&json_of(&server, "/v1/health/state/any").await),
        vec!["one", "serfHealth", "two"]
    );
    assert_eq!(json_of(&server, "/v1/health/state/odd").await, json!([]));
}

/// Node maintenance makes every instance fail `?passing`; service maintenance only that
/// instance; both need `?enable`, and a service's needs the service.
#[tokio::test]
async fn maintenance_takes_instances_out_of_passing() {
    let server = ServerProcess::start();
    for id in ["a", "b"] {
        register(
            &server,
            json!({"ID": id, "Name": "app", "Check": {"TTL": "30s", "Status": "passing"}}),
        )
        .await;
    }
    let passing = || async { ids(&json_of(&server, "/v1/health/service/app?passing").await).len() };
    assert_eq!(passing().await, 2);
    let missing = put(&server, "/v1/agent/maintenance", "").await;
    assert_eq!(missing.status(), 400);
    assert_eq!(missing.text().await.unwrap(), "Missing value for enable");
    let bad = put(&server, "/v1/agent/maintenance?enable=maybe", "").await;
    assert_eq!(
        bad.text().await.unwrap(),
        "Invalid value for enable: \"maybe\""
    );
    assert_eq!(
        put(
            &server,
            "/v1/agent/service/maintenance/a?enable=true&reason=deploy",
            ""
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        ids(&json_of(&server, "/v1/health/service/app?passing").await),
        vec!["b"]
    );
    let checks = json_of(&server, "/v1/agent/checks").await;
    let maint = &checks["_service_maintenance:a"];
    assert_eq!(maint["Notes"], "deploy");
    assert_eq!(maint["Type"], "maintenance");
    assert_eq!(maint["Name"], "Service Maintenance Mode");
    put(&server, "/v1/agent/maintenance?enable=true", "").await;
    assert_eq!(passing().await, 0);
    put(&server, "/v1/agent/maintenance?enable=false", "").await;
    put(&server, "/v1/agent/service/maintenance/a?enable=false", "").await;
    assert_eq!(passing().await, 2);
    let unknown = put(&server, "/v1/agent/service/maintenance/zz?enable=true", "").await;
    assert_eq!(unknown.status(), 404);
}

/// `/v1/agent/members` lists this agent as an alive member.
#[tokio::test]
async fn members_list_the_agent() {
    let server = ServerProcess::start();
    let members = json_of(&server, "/v1/agent/members").await;
    assert_eq!(members.as_array().unwrap().len(), 1);
    assert_eq!(members[0]["Name"], "test-node");
    assert_eq!(members[0]["Status"], 1);
    assert_eq!(members[0]["Tags"]["role"], "consul");
    let me: Value = json_of(&server, "/v1/agent/self").await;
    assert_eq!(me["Member"], members[0]);
    let wan = json_of(&server, "/v1/agent/members?wan=1").await;
    assert_eq!(wan[0]["Name"], "test-node.dc1");
    assert_eq!(wan[0]["Port"], 8302);
}

/// `/v1/health/checks/<service>` lists the checks of that service's instances only;
/// `/v1/health/node/<node>` every check of the node.
#[tokio::test]
async fn health_checks_by_service_and_by_node() {
    let server = ServerProcess::start();
    register(
        &server,
        json!({"ID": "f", "Name": "foobar", "Check": {"TTL": "10s"}}),
    )
    .await;
    let checks = json_of(&server, "/v1/health/checks/foobar").await;
    assert_eq!(checks[0]["CheckID"], "service:f");
    assert_eq!(checks.as_array().unwrap().len(), 1);
    let node = json_of(&server, "/v1/health/node/test-node").await;
    let ids: Vec<&str> = node
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["CheckID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["serfHealth", "service:f"]);
    assert_eq!(json_of(&server, "/v1/health/node/other").await, json!([]));
    put(&server, "/v1/agent/service/deregister/f", "").await;
    assert_eq!(
        json_of(&server, "/v1/health/checks/foobar").await,
        json!([])
    );
}

/// Events: a fire answers with the event (ID, Version 1, LTime 0, payload in base64); the
/// list has it with its Lamport time, filters by `?name`, and a blocking list returns when
/// the next event fires; an event for other nodes is not kept by this agent.
#[tokio::test]
async fn events_fire_and_list_as_one_agent() {
    let server = ServerProcess::start();
    let fired = put(&server, "/v1/event/fire/deploy", "v2").await;
    assert_eq!(fired.status(), 200);
    let fired: Value = fired.json().await.unwrap();
    assert_eq!(fired["Name"], "deploy");
    assert_eq!(fired["Payload"], b64("v2"));
    assert_eq!(fired["Version"], 1);
    assert_eq!(fired["LTime"], 0);
    assert_eq!(fired["ID"].as_str().unwrap().len(), 36);
    put(&server, "/v1/event/fire/other", "").await;
    put(&server, "/v1/event/fire/elsewhere?node=^nobody$", "").await;

    let list = get(&server, "/v1/event/list").await;
    let index = index_of(&list);
    let events: Value = list.json().await.unwrap();
    let names: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["deploy", "other"]);
    assert_eq!(events[0]["ID"], fired["ID"]);
    assert!(events[0]["LTime"].as_u64().unwrap() > 0);
    assert_eq!(events[1]["Payload"], Value::Null);
    let named = json_of(&server, "/v1/event/list?name=deploy").await;
    assert_eq!(named.as_array().unwrap().len(), 1);

    let url = server.url(&format!("/v1/event/list?index={index}&wait=10s"));
    let waiter = tokio::spawn(async move { client().get(url).send().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the blocking list returned at once");
    put(&server, "/v1/event/fire/third", "").await;
    let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the blocking list woke")
        .unwrap();
    assert_ne!(index_of(&woke), index);
    let events: Value = woke.json().await.unwrap();
    assert_eq!(events.as_array().unwrap().len(), 3);

    let missing = put(&server, "/v1/event/fire/x?tag=a", "").await;
    assert_eq!(missing.status(), 500);
    assert_eq!(
        missing.text().await.unwrap(),
        "Cannot provide tag filter without service filter"
    );
}

/// Services and their checks are durable: after a restart on the same data dir the
/// registration is there.
#[tokio::test]
async fn services_survive_a_restart() {
    let mut server = ServerProcess::start();
    register(
        &server,
        json!({"ID": "keep", "Name": "app", "Tags": ["leader"], "Check": {"TTL": "30s", "Status": "passing"}}),
    )
    .await;
    let temp = server.take_temp();
    let dir = server.data_dir.clone();
    let addr = server.addr.clone();
    assert!(server.terminate().success());
    let server = ServerProcess::start_at(&addr, &dir, &[]).unwrap();
    let services = json_of(&server, "/v1/agent/services").await;
    assert_eq!(services["keep"]["Tags"], json!(["leader"]));
    let health = json_of(&server, "/v1/health/service/app?passing").await;
    assert_eq!(ids(&health), vec!["keep"]);
    drop(temp);
}
