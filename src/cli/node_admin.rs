//! An admin's record of a node (`/hostlet/node-labels/<node>`): its labels and cordon, changed by
//! `hostlet node label` and `hostlet node cordon|uncordon|drain`.

use hostlet_api::objects::NodeInfo;

use super::exit::CliError;

/// Changes an admin's record of node `name` (labels, cordon) with `edit`, which also sees the node's own
/// labels; written only if nobody wrote meanwhile (another admin's change is read again). What `edit`
/// said is returned.
pub async fn edit_admin(
    etcd: &hostlet_runtime::Etcd,
    keys: &hostlet_api::KeyLayout,
    name: &str,
    edit: impl Fn(
        &mut hostlet_api::labels::AdminLabels,
        &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<String>, CliError>,
) -> Result<Vec<String>, CliError> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    use hostlet_api::labels::AdminLabels;
    let record = etcd
        .get(keys.node(name))
        .await?
        .ok_or_else(|| CliError::not_found(format!("no node {name:?} (hostlet node ls)")))?;
    let own = serde_json::from_slice::<NodeInfo>(record.value())
        .map(|i| i.labels)
        .unwrap_or_default();
    let key = keys.node_labels(name);
    for _ in 0..5 {
        let current = etcd.get(&key).await?;
        let mut admin = match &current {
            Some(kv) => serde_json::from_slice::<AdminLabels>(kv.value()).map_err(|e| {
                CliError::refused(format!(
                    "{key} does not parse ({e}); fix or delete it first"
                ))
            })?,
            None => AdminLabels::default(),
        };
        let said = edit(&mut admin, &own)?;
        let value = serde_json::to_string(&admin).map_err(|e| CliError::from(e.to_string()))?;
        let revision = current.as_ref().map_or(0, |kv| kv.mod_revision());
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(key.clone(), value, None)]);
        if etcd.txn(txn).await?.succeeded() {
            return Ok(said);
        }
    }
    Err(CliError::from(format!(
        "{key} kept changing under this command; try again"
    )))
}
