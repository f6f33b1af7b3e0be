//! Watches on a prefix.

use etcd_client::{WatchOptions, WatchStream, Watcher};

use super::{Etcd, EtcdError, MAX_DECODING_MESSAGE_SIZE};

impl Etcd {
    /// Opens a watch on `prefix` from `start_revision` (inclusive). Keep the [`Watcher`]: dropping it ends
    /// the stream on the server side.
    pub async fn watch_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
        start_revision: i64,
    ) -> Result<(Watcher, WatchStream), EtcdError> {
        let prefix = prefix.as_ref();
        self.with_retry(|c| async move {
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(start_revision);
            c.watch_client()
                .max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
                .watch(prefix, Some(opts))
                .await
        })
        .await
    }
}
