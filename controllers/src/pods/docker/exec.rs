//! `pod exec`: a command in a running container with its streams attached.

use std::time::Duration;

use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use futures::stream::BoxStream;
use futures::StreamExt;

use super::{map_err, DockerRuntime};
use crate::pods::runtime::RuntimeError;

/// An exec's streams, attached: what it prints, where its input goes, and its id (to resize and inspect).
pub struct ExecSession {
    pub id: String,
    pub output: BoxStream<'static, Result<ExecOutput, RuntimeError>>,
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

/// A piece of an exec's output; under a TTY everything is `Stdout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutput {
    Stdout(bytes::Bytes),
    Stderr(bytes::Bytes),
}

impl DockerRuntime {
    /// Starts `command` in a running container with its streams attached.
    pub async fn exec_attached(
        &self,
        id: &str,
        command: Vec<String>,
        stdin: bool,
        tty: bool,
    ) -> Result<ExecSession, RuntimeError> {
        let created = self
            .call("exec", |d| async move {
                let config = ExecConfig {
                    cmd: Some(command),
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(tty),
                    ..Default::default()
                };
                d.create_exec(id, config).await
            })
            .await?;
        let exec_id = created.id;
        let eid = exec_id.clone();
        let docker = self
            .client()
            .await?
            .clone()
            .with_timeout(Duration::from_secs(u64::from(u32::MAX)));
        let started = docker
            .start_exec(
                &eid,
                Some(StartExecOptions {
                    detach: false,
                    tty,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(map_err)?;
        match started {
            StartExecResults::Attached { output, input } => Ok(ExecSession {
                id: exec_id,
                output: output
                    .map(|r| match r {
                        Ok(bollard::container::LogOutput::StdErr { message }) => {
                            Ok(ExecOutput::Stderr(message))
                        }
                        Ok(o) => Ok(ExecOutput::Stdout(o.into_bytes())),
                        Err(e) => Err(map_err(e)),
                    })
                    .boxed(),
                input,
            }),
            StartExecResults::Detached => Err(RuntimeError::Other(
                "the engine started the exec detached".into(),
            )),
        }
    }

    /// Sets an exec's terminal size.
    pub async fn resize_exec(
        &self,
        exec_id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<(), RuntimeError> {
        self.call("exec_resize", |d| async move {
            let opts = bollard::query_parameters::ResizeExecOptionsBuilder::new()
                .h(i32::from(rows))
                .w(i32::from(cols))
                .build();
            d.resize_exec(exec_id, opts).await
        })
        .await
    }

    /// An exec's exit code once it has ended (`None` while it still runs).
    pub async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, RuntimeError> {
        let r = self
            .call("exec", |d| async move { d.inspect_exec(exec_id).await })
            .await?;
        Ok(if r.running == Some(true) {
            None
        } else {
            r.exit_code
        })
    }
}
