//! Keys: reads (one key, a prefix page by page), writes, deletes and transactions.

use etcd_client::{DeleteOptions, GetOptions, KeyValue, PutOptions, Txn, TxnResponse};

use super::{Etcd, EtcdError, MAX_DECODING_MESSAGE_SIZE};

/// Keys per page when listing a prefix; keeps each response well under the decoding limit.
pub const LIST_PAGE_SIZE: i64 = 1000;

impl Etcd {
    /// One key, if present.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<KeyValue>, EtcdError> {
        let key = key.as_ref();
        let mut resp = self
            .with_retry(|mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// Every key under `prefix`, read page by page at one revision, and that revision.
    pub async fn get_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        let prefix = prefix.as_ref();
        let mut out = Vec::new();
        let mut revision = 0;
        let mut from: Vec<u8> = prefix.to_vec();
        loop {
            let page = self
                .list_page(prefix, &from, revision, LIST_PAGE_SIZE)
                .await?;
            revision = page.revision;
            let more = page.more;
            if let Some(last) = page.kvs.last() {
                from = key_after(last.key());
            }
            out.extend(page.kvs);
            if !more {
                return Ok((out, revision));
            }
        }
    }

    /// The keys (no values) under `prefix`, in key order.
    pub async fn keys_with_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> Result<Vec<Vec<u8>>, EtcdError> {
        let prefix = prefix.as_ref();
        let end = prefix_end(prefix);
        let mut resp = self
            .with_retry(|c| {
                let end = end.clone();
                async move {
                    let opts = GetOptions::new().with_range(end).with_keys_only();
                    c.kv_client()
                        .max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
                        .get(prefix, Some(opts))
                        .await
                }
            })
            .await?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .map(|kv| kv.key().to_vec())
            .collect())
    }

    /// One page of a prefix: keys in `[from, end of prefix)` at `revision` (0: the latest).
    pub async fn list_page(
        &self,
        prefix: &[u8],
        from: &[u8],
        revision: i64,
        limit: i64,
    ) -> Result<ListPage, EtcdError> {
        let end = prefix_end(prefix);
        let result = self
            .with_retry(|c| {
                let end = end.clone();
                async move {
                    let opts = GetOptions::new()
                        .with_range(end)
                        .with_revision(revision)
                        .with_limit(limit);
                    c.kv_client()
                        .max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
                        .get(from, Some(opts))
                        .await
                }
            })
            .await;
        let mut resp = match result {
            Ok(r) => r,
            Err(EtcdError::Compacted { source, .. }) => {
                return Err(EtcdError::Compacted { revision, source })
            }
            Err(e) => return Err(e),
        };
        let rev = resp.header().map(|h| h.revision()).unwrap_or(revision);
        Ok(ListPage {
            revision: if revision > 0 { revision } else { rev },
            more: resp.more(),
            kvs: resp.take_kvs(),
        })
    }

    /// A transaction, tried on the next endpoint as [`Etcd::with_retry`] does: give guarded ones only
    /// (a compare that a second attempt, after an unseen success, fails instead of applying twice).
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, EtcdError> {
        self.with_retry(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Writes a value; returns the revision of the write.
    pub async fn put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<i64, EtcdError> {
        self.put_opts(key.as_ref(), value.as_ref(), None).await
    }

    /// Writes a value attached to a lease (it goes when the lease expires).
    pub async fn put_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: i64,
    ) -> Result<i64, EtcdError> {
        self.put_opts(
            key.as_ref(),
            value.as_ref(),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
    }

    async fn put_opts(
        &self,
        key: &[u8],
        value: &[u8],
        opts: Option<PutOptions>,
    ) -> Result<i64, EtcdError> {
        let resp = self
            .with_retry(|mut c| {
                let opts = opts.clone();
                async move { c.put(key, value, opts).await }
            })
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Deletes one key; returns how many keys went (0 or 1).
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64, EtcdError> {
        let key = key.as_ref();
        let resp = self
            .with_retry(|mut c| async move { c.delete(key, None).await })
            .await?;
        Ok(resp.deleted())
    }

    /// Deletes every key under `prefix`; returns how many went.
    pub async fn delete_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<i64, EtcdError> {
        let prefix = prefix.as_ref();
        let resp = self
            .with_retry(|mut c| async move {
                c.delete(prefix, Some(DeleteOptions::new().with_prefix()))
                    .await
            })
            .await?;
        Ok(resp.deleted())
    }
}

/// One page of a prefix listing.
#[derive(Debug)]
pub struct ListPage {
    /// The revision the page was read at.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// More keys follow the last one.
    pub more: bool,
}

/// The end of the key range of `prefix` (etcd's `--prefix`): the prefix with its last byte incremented.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// The smallest key greater than `key`.
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(key_after(b"k"), b"k\0".to_vec());
    }
}
