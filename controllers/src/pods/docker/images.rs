//! What the image collector asks of Docker.

use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
};

use super::DockerRuntime;
use crate::pods::runtime::RuntimeError;

impl crate::pods::images::ImageEngine for DockerRuntime {
    async fn usage(&self) -> Result<crate::pods::images::Usage, RuntimeError> {
        let root = self
            .inner
            .root
            .get_or_try_init(|| async {
                let info = self.call("info", |d| async move { d.info().await }).await?;
                info.docker_root_dir
                    .filter(|r| !r.is_empty())
                    .map(std::path::PathBuf::from)
                    .ok_or_else(|| RuntimeError::Other("the engine names no root dir".into()))
            })
            .await?;
        // Where the agent cannot see the engine's root (a container without it mounted), nothing is measured
        // and so nothing is removed.
        let (available, capacity) = crate::disk::statfs(root)
            .map_err(|e| RuntimeError::Other(format!("{}: {e}", root.display())))?;
        Ok(crate::pods::images::Usage {
            capacity,
            available,
        })
    }

    async fn images(&self) -> Result<Vec<crate::pods::images::ImageInfo>, RuntimeError> {
        let list = self
            .call("image_list", |d| async move {
                d.list_images(Some(ListImagesOptionsBuilder::new().all(false).build()))
                    .await
            })
            .await?;
        Ok(list
            .into_iter()
            .map(|i| crate::pods::images::ImageInfo {
                id: i.id,
                tags: i
                    .repo_tags
                    .into_iter()
                    .filter(|t| t != "<none>:<none>")
                    .collect(),
                size: u64::try_from(i.size).unwrap_or(0),
                created: i.created,
            })
            .collect())
    }

    async fn images_in_use(&self) -> Result<std::collections::HashSet<String>, RuntimeError> {
        // Every container of the engine, not only this node's: another's image is not ours to remove.
        let list = self
            .call("list_all", |d| async move {
                d.list_containers(Some(ListContainersOptionsBuilder::new().all(true).build()))
                    .await
            })
            .await?;
        Ok(list.into_iter().filter_map(|c| c.image_id).collect())
    }

    async fn image_id(&self, reference: &str) -> Result<Option<String>, RuntimeError> {
        match self
            .call("image_inspect", |d| async move {
                d.inspect_image(reference).await
            })
            .await
        {
            Ok(i) => Ok(i.id),
            Err(RuntimeError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn remove_image(
        &self,
        image: &crate::pods::images::ImageInfo,
    ) -> Result<(), RuntimeError> {
        // By name, without force: the last name goes with the image, and Docker refuses while a container
        // uses it. An untagged image goes by id.
        let names = if image.tags.is_empty() {
            vec![image.id.clone()]
        } else {
            image.tags.clone()
        };
        for name in names {
            let name = name.as_str();
            self.call("image_remove", |d| async move {
                d.remove_image(
                    name,
                    Some(
                        RemoveImageOptionsBuilder::new()
                            .force(false)
                            .noprune(false)
                            .build(),
                    ),
                    None,
                )
                .await
            })
            .await?;
        }
        Ok(())
    }
}

/// A load or a save may take minutes for a large archive: it gets this long rather than the usual request
/// timeout.
const LOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

impl DockerRuntime {
    /// The client for a load or a save.
    pub(crate) async fn long_client(&self) -> Result<bollard::Docker, RuntimeError> {
        Ok(self.client().await?.clone().with_timeout(LOAD_TIMEOUT))
    }
}

impl crate::pods::image_dir::ImageLoader for DockerRuntime {
    async fn load(
        &self,
        tar: futures::stream::BoxStream<'static, bytes::Bytes>,
    ) -> Result<Vec<String>, RuntimeError> {
        use futures::TryStreamExt;
        let docker = self.long_client().await?;
        let start = std::time::Instant::now();
        let opts = bollard::query_parameters::ImportImageOptionsBuilder::new()
            .quiet(true)
            .build();
        let answer: Result<Vec<bollard::models::BuildInfo>, _> = docker
            .import_image_stream(opts, tar, None)
            .try_collect()
            .await;
        self.inner
            .metrics
            .observe("image_load", answer.is_ok(), start.elapsed().as_secs_f64());
        Ok(loaded_names(&answer.map_err(super::map_err)?))
    }

    async fn loaded_id(&self, reference: &str) -> Result<Option<String>, RuntimeError> {
        crate::pods::images::ImageEngine::image_id(self, reference).await
    }
}

/// The images `docker load` says it loaded: `Loaded image: name:tag` or, for an untagged one, `Loaded image
/// ID: sha256:…`.
fn loaded_names(answer: &[bollard::models::BuildInfo]) -> Vec<String> {
    answer
        .iter()
        .filter_map(|i| i.stream.as_deref())
        .flat_map(str::lines)
        .filter_map(|l| {
            l.strip_prefix("Loaded image ID: ")
                .or_else(|| l.strip_prefix("Loaded image: "))
        })
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_loaded_images_are_read_from_the_engine_s_answer() {
        let info = |s: &str| bollard::models::BuildInfo {
            stream: Some(s.to_string()),
            ..Default::default()
        };
        let answer = [
            info("Loaded image: app/one:1\n"),
            info("Loaded image ID: sha256:abc\nLoaded image: app/two:2\n"),
            info("unrelated\n"),
        ];
        assert_eq!(
            super::loaded_names(&answer),
            ["app/one:1", "sha256:abc", "app/two:2"]
        );
    }
}
