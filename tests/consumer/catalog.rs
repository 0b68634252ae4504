//! Replicas in the service catalog: each registers itself as an instance of `leaderq` with
//! its node id, observe address and role tag, so `/v1/health/service/leaderq?passing` shows
//! who leads, before and after a SIGTERM handover.

use super::*;

/// The passing `leaderq` instances as (id, tags, port), read with blocking queries until
/// `done` holds them (guarded against hangs).
async fn wait_for_instances(
    bed: &Bed,
    limit: Duration,
    done: impl Fn(&[(String, Vec<String>, u64)]) -> bool,
) -> Vec<(String, Vec<String>, u64)> {
    let mut index = 0;
    wait_until(limit, "the catalog showing what was expected", async || {
        let response = client()
            .get(bed.cluster.url(&format!(
                "/v1/health/service/leaderq?passing&index={index}&wait=2s"
            )))
            .send()
            .await
            .unwrap();
        index = index_of(&response);
        let nodes: Value = response.json().await.unwrap();
        let instances: Vec<(String, Vec<String>, u64)> = nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let service = &n["Service"];
                let tags = service["Tags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap().to_string())
                    .collect();
                (
                    service["ID"].as_str().unwrap().to_string(),
                    tags,
                    service["Port"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        if done(&instances) {
            Ok(instances)
        } else {
            Err(instances)
        }
    })
    .await
}

fn tagged<'a>(instances: &'a [(String, Vec<String>, u64)], tag: &str) -> Vec<&'a str> {
    instances
        .iter()
        .filter(|(_, tags, _)| tags.iter().any(|t| t == tag))
        .map(|(id, _, _)| id.as_str())
        .collect()
}

/// Two replicas show as passing `leaderq` instances: the key holder tagged `leader` and
/// reachable at its observe port, the other `standby`. After SIGTERM to the leader, the
/// standby is the only instance and is tagged `leader`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_show_in_the_catalog_with_their_role_across_a_handover() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.start_replica("r2");
    let first = bed.leader(Duration::from_secs(30)).await;
    let second = if first == "r1" { "r2" } else { "r1" };
    let instances = wait_for_instances(&bed, Duration::from_secs(20), |i| {
        i.len() == 2 && tagged(i, "leader").len() == 1 && tagged(i, "standby").len() == 1
    })
    .await;
    assert_eq!(tagged(&instances, "leader"), vec![first.as_str()]);
    assert_eq!(tagged(&instances, "standby"), vec![second]);
    let leader_port = instances.iter().find(|(id, _, _)| *id == first).unwrap().2;
    let observe = observe_address(bed.replica(&first)).await;
    assert!(
        observe.ends_with(&format!(":{leader_port}")),
        "{observe} vs port {leader_port}"
    );
    let checks: Value = get_json(&bed.cluster.url("/v1/agent/checks")).await;
    assert_eq!(
        checks[format!("leaderq:{first}")]["ServiceID"],
        first.as_str()
    );

    let status = bed.replica(&first).terminate();
    assert!(status.success(), "leader exit status {status}");
    let instances = wait_for_instances(&bed, Duration::from_secs(20), |i| {
        i.len() == 1 && tagged(i, "leader") == vec![second]
    })
    .await;
    assert_eq!(instances[0].0, second);
    let services: Value = get_json(&bed.cluster.url("/v1/agent/services")).await;
    assert!(services.get(&first).is_none(), "{services}");
}
