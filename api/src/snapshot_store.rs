//! Where sealed snapshots are kept (`serve --snapshot-store`): a local directory (the default,
//! `<data-dir>/snapshots`, and what `dev` uses) or any S3-compatible service
//! (`s3://BUCKET[/PREFIX]`, credentials, region and endpoint from the `AWS_*` environment
//! variables `object_store` reads: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`). Objects are named `clusters/<id>/snapshots/<id>-<upload>`; what
//! is written is already sealed ([`crate::snapshots::cipher`]), so the store never sees a snapshot.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};

/// A `--snapshot-store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A directory on this machine (made 0700 when missing).
    Local(PathBuf),
    /// A bucket of an S3-compatible service, and a prefix inside it (may be empty).
    S3 { bucket: String, prefix: String },
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(dir) => write!(f, "{}", dir.display()),
            Self::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// Why a store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "--snapshot-store `{0}` is neither a directory nor s3://BUCKET[/PREFIX] (a bucket name \
         is 3–63 of a-z, 0-9, '.', '-')"
    )]
    BadLocation(String),
    #[error("the snapshot directory {path}: {source}")]
    Directory {
        path: String,
        source: std::io::Error,
    },
    #[error("the snapshot store {location}: {source}")]
    Store {
        location: String,
        source: object_store::Error,
    },
}

impl FromStr for Location {
    type Err = StoreError;

    fn from_str(text: &str) -> Result<Self, StoreError> {
        let bad = || StoreError::BadLocation(text.chars().take(200).collect());
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let valid_bucket = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'
                });
            let prefix = prefix.trim_matches('/');
            if !valid_bucket || prefix.split('/').any(|p| p == "." || p == "..") {
                return Err(bad());
            }
            return Ok(Self::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.to_owned(),
            });
        }
        let path = text.strip_prefix("file://").unwrap_or(text);
        if path.is_empty() || path.contains("://") {
            return Err(bad());
        }
        Ok(Self::Local(PathBuf::from(path)))
    }
}

/// An opened store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: String,
    location: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.location)
    }
}

impl Store {
    /// Opens `location` (no request is made: a store that cannot be reached fails its first
    /// snapshot, which says why).
    pub fn open(location: &Location) -> Result<Self, StoreError> {
        let described = location.to_string();
        let failed = |source| StoreError::Store {
            location: described.clone(),
            source,
        };
        let (inner, prefix): (Arc<dyn ObjectStore>, String) = match location {
            Location::Local(dir) => {
                let directory = |source| StoreError::Directory {
                    path: dir.display().to_string(),
                    source,
                };
                std::fs::create_dir_all(dir).map_err(directory)?;
                std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .map_err(directory)?;
                let local =
                    object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(failed)?;
                (Arc::new(local), String::new())
            }
            Location::S3 { bucket, prefix } => {
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .map_err(failed)?;
                (Arc::new(s3), prefix.clone())
            }
        };
        Ok(Self {
            inner,
            prefix,
            location: described,
        })
    }

    /// What `--snapshot-store` named.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The object of one upload (`attempt`, random) of snapshot `snapshot_id` of cluster
    /// `cluster_id`: two uploads of one snapshot never write, or delete, each other's object.
    pub fn key(&self, cluster_id: i64, snapshot_id: i64, attempt: &str) -> String {
        let key = format!("clusters/{cluster_id}/snapshots/{snapshot_id}-{attempt}");
        if self.prefix.is_empty() {
            key
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn failed(&self, source: object_store::Error) -> StoreError {
        StoreError::Store {
            location: self.location.clone(),
            source,
        }
    }

    /// A writer of `key`: the object appears whole when it finishes, or not at all.
    pub async fn writer(&self, key: &str) -> Result<WriteMultipart, StoreError> {
        let upload = self
            .inner
            .put_multipart(&ObjectPath::from(key))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(WriteMultipart::new(upload))
    }

    /// Finishes a writer.
    pub async fn finish(&self, writer: WriteMultipart) -> Result<(), StoreError> {
        writer.finish().await.map(drop).map_err(|e| self.failed(e))
    }

    /// `key`'s bytes, as they come.
    pub async fn read(
        &self,
        key: &str,
    ) -> Result<
        futures_util::stream::BoxStream<'static, Result<bytes::Bytes, StoreError>>,
        StoreError,
    > {
        use futures_util::StreamExt as _;
        let got = self
            .inner
            .get(&ObjectPath::from(key))
            .await
            .map_err(|e| self.failed(e))?;
        let location = self.location.clone();
        Ok(got
            .into_stream()
            .map(move |r| {
                r.map_err(|source| StoreError::Store {
                    location: location.clone(),
                    source,
                })
            })
            .boxed())
    }

    /// Deletes `key`; one already gone is not an error.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.inner.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_bad_ones_are_named() {
        assert_eq!(
            "/var/lib/exk8s/snapshots".parse::<Location>().unwrap(),
            Location::Local("/var/lib/exk8s/snapshots".into())
        );
        assert_eq!(
            "file:///srv/snap".parse::<Location>().unwrap(),
            Location::Local("/srv/snap".into())
        );
        assert_eq!(
            "s3://backups/exk8s/prod/".parse::<Location>().unwrap(),
            Location::S3 {
                bucket: "backups".into(),
                prefix: "exk8s/prod".into()
            }
        );
        for bad in [
            "s3://Bad_Bucket",
            "s3://ab",
            "s3://backups/../x",
            "gs://b/x",
            "",
        ] {
            let e = bad.parse::<Location>().unwrap_err();
            assert!(e.to_string().contains("--snapshot-store"), "{e}");
        }
    }
}
