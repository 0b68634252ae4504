//! Catalog reads: `/v1/catalog/nodes`.

use super::*;

pub(super) async fn catalog_nodes(req: Req<'_>) -> Reply {
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let nodes: Vec<Value> = state
            .node()
            .map(|node| {
                json!({
                    "ID": node.id,
                    "Node": node.name,
                    "Address": node.address,
                    "Datacenter": DATACENTER,
                    "TaggedAddresses": {"lan": node.address, "lan_ipv4": node.address, "wan": node.address, "wan_ipv4": node.address},
                    "Meta": {"consul-network-segment": ""},
                    "CreateIndex": node.create_index,
                    "ModifyIndex": node.modify_index,
                })
            })
            .into_iter()
            .collect();
        (state.tables().nodes.max(1), to_json(&nodes, pretty))
    })
    .await;
    Ok(with_meta(json_body(body), Some(index)))
}
