//! At run time: notice that this node's member was removed from the cluster, or that an operator asked
//! for a rejoin (`/hostlet/hosts/<node>/requests/tombstone`), and say why. The agent then writes the
//! tombstone, stops cleanly and starts again as a joiner (the start backs the member dir up).

use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::Etcd;
use tokio_util::sync::CancellationToken;

/// How often membership and the request key are checked.
pub const CHECK_PERIOD: Duration = Duration::from_secs(1);

/// Waits until this member must rejoin; returns why, or `None` on shutdown.
///
/// Removal is only believed from a member list that answered and does not hold `member_id` twice in a
/// row, so a transient answer from a member that is still catching up cannot trigger it.
pub async fn wait_for_rejoin(
    etcd: Etcd,
    keys: KeyLayout,
    node: String,
    member_id: u64,
    shutdown: CancellationToken,
) -> Option<String> {
    let request = keys.tombstone_request(&node);
    let mut missing = 0;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(CHECK_PERIOD) => {}
        }
        if let Ok(Some(_)) = etcd.get(&request).await {
            let _ = etcd.delete(&request).await;
            return Some(format!("asked to rejoin through {request}"));
        }
        match etcd.member_list().await {
            Ok(members) if !members.is_empty() && !members.iter().any(|m| m.id() == member_id) => {
                missing += 1;
                if missing >= 2 {
                    return Some(format!("member {member_id:x} was removed from the cluster"));
                }
            }
            _ => missing = 0,
        }
    }
}

/// Another node's API URL to rejoin through, from the node records.
pub async fn rejoin_server(etcd: &Etcd, keys: &KeyLayout, node: &str) -> Option<String> {
    let (kvs, _) = etcd.get_prefix(keys.nodes_prefix()).await.ok()?;
    kvs.iter()
        .filter_map(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
        .filter(|n| n.name != node)
        .find_map(|n| n.api_url)
}
