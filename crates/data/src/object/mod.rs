//! Input from object storage: `s3://bucket/key-or-prefix` and `file:///dir/` inputs through
//! `object_store` (crate feature `object-store`).
//!
//! * [`ObjectClient`]: one per reader: a small tokio runtime and the stores it has opened (one
//!   per bucket), configured from [`ObjectOptions`] (by default the standard `AWS_*`
//!   environment variables, as checkpoint locations are).
//! * [`ObjectClient::expand`]: an input URL names one object, every object under a prefix
//!   (`s3://bucket/logs/` or a prefix without the slash when no object has that exact name), or
//!   the objects matching a glob in their key (`s3://bucket/logs/day=*/part-*.gz`); always in
//!   name order, so positions (file index, byte offset) stay valid while new objects sorting
//!   after the old ones are added.
//! * [`range::ObjectRange`]: an object as a [`crate::RangeRead`] whose ranged reads are issued
//!   ahead of the reader on several connections (see its docs), with retries and backoff on
//!   transient errors; an object rewritten while read is refused by its ETag.
//!
//! Errors name the object URL: not found, access denied (credentials or policy) and a store
//! that stays unreachable after the retries are told apart.
//!
//! URL parsing, the store clients, the runtime and the retry policy are `sparta_blob`'s (the
//! blob layer shared with checkpoint locations); listing, globs and read-ahead are here.

pub mod range;

/// Objects whose first bytes are fetched at once by [`ObjectClient::open_listed`].
pub const OPEN_CONCURRENCY: usize = 16;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectMeta, ObjectStore};
use parking_lot::Mutex;

use sparta_blob::store::{self, S3Options};
use sparta_blob::{Backoff, BlobError, BlockingRuntime, ObjectUrl, StoreId, UrlError};

use crate::error::DataError;
pub use range::{ObjectRange, Prefetch};

/// How objects are reached and read.
#[derive(Clone, Debug)]
pub struct ObjectOptions {
    /// S3 endpoint (an S3-compatible service such as MinIO or moto); `None`: `AWS_ENDPOINT`
    /// or AWS itself.
    pub endpoint: Option<String>,
    /// Access key id and secret; `None`: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
    pub credentials: Option<(String, String)>,
    /// Region; `None`: `AWS_REGION` / `AWS_DEFAULT_REGION`.
    pub region: Option<String>,
    /// Allow a plain-HTTP endpoint (also `AWS_ALLOW_HTTP=true`).
    pub allow_http: bool,
    /// Read-ahead of every open object.
    pub prefetch: Prefetch,
    /// Attempts of one ranged read before it fails (transient errors only).
    pub max_attempts: u32,
    /// Wait after the first failed attempt; doubles up to 5 s.
    pub first_backoff: Duration,
}

impl Default for ObjectOptions {
    fn default() -> Self {
        ObjectOptions {
            endpoint: None,
            credentials: None,
            region: None,
            allow_http: false,
            prefetch: Prefetch::default(),
            max_attempts: 12,
            first_backoff: Duration::from_millis(200),
        }
    }
}

/// Longest wait between two attempts of a request.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl ObjectOptions {
    /// The overrides of the `AWS_*` environment for S3 clients.
    fn s3_options(&self) -> S3Options {
        S3Options {
            endpoint: self.endpoint.clone(),
            credentials: self.credentials.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            client_retry: Some(object_store::RetryConfig {
                // Our own retries (`range::with_retries`) wait and count; the client's retries
                // only smooth over single dropped requests.
                max_retries: 2,
                retry_timeout: Duration::from_secs(10),
                ..Default::default()
            }),
        }
    }

    /// The retries of every request: `max_attempts`, waiting `first_backoff`, doubling up to
    /// 5 s.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(self.max_attempts, self.first_backoff, MAX_BACKOFF)
    }

    /// The defaults, with the read-ahead and retries overridden by `SPARTA_OBJECT_BLOCK_BYTES`,
    /// `SPARTA_OBJECT_READ_AHEAD` and `SPARTA_OBJECT_MAX_ATTEMPTS` when set (the store itself is
    /// configured by the `AWS_*` variables). A set variable that is not a number is an error
    /// naming it.
    pub fn from_env() -> Result<ObjectOptions, DataError> {
        let mut o = ObjectOptions::default();
        let num = |name: &str| -> Result<Option<u64>, DataError> {
            match std::env::var(name) {
                Ok(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                    DataError::Config(format!("{name}={v:?}: expected a whole number"))
                }),
                Err(_) => Ok(None),
            }
        };
        if let Some(b) = num("SPARTA_OBJECT_BLOCK_BYTES")? {
            o.prefetch.block = (b as usize).max(4096);
        }
        if let Some(a) = num("SPARTA_OBJECT_READ_AHEAD")? {
            o.prefetch.ahead = a as usize;
        }
        if let Some(m) = num("SPARTA_OBJECT_MAX_ATTEMPTS")? {
            o.max_attempts = (m as u32).max(1);
        }
        Ok(o)
    }
}

/// `url` parsed by the blob layer's one URL parser; the error says what inputs may be.
fn parse(url: &str) -> Result<ObjectUrl, DataError> {
    ObjectUrl::parse(url).map_err(|e| {
        let why = match &e {
            BlobError::Url { kind, .. } => match kind {
                UrlError::NotAUrl => "not a URL".to_string(),
                UrlError::NoBucket => "no bucket: expected s3://bucket/key-or-prefix".to_string(),
                UrlError::NotAbsolute => {
                    "a file:// input needs an absolute path: file:///abs/path".to_string()
                }
                UrlError::UnsupportedScheme(other) => format!(
                    "unsupported scheme `{other}://`: inputs are local paths, s3://bucket/key \
                     and file:///abs/path"
                ),
            },
            other => other.to_string(),
        };
        DataError::Config(format!("input `{url}`: {why}"))
    })
}

/// One object found by [`ObjectClient::expand`].
#[derive(Clone, Debug)]
pub struct ObjectEntry {
    /// Its URL (what positions and messages name).
    pub url: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Its ETag, checked on every read (`None` when the store has none).
    pub e_tag: Option<String>,
}

/// Opens and reads objects (see the module docs). Cheap to share (`Arc`).
pub struct ObjectClient {
    opts: ObjectOptions,
    rt: BlockingRuntime,
    stores: Mutex<HashMap<StoreId, Arc<dyn ObjectStore>>>,
}

impl std::fmt::Debug for ObjectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectClient")
            .field("opts", &self.opts)
            .finish()
    }
}

impl ObjectClient {
    /// A client; starts its runtime (no request is sent).
    pub fn new(opts: ObjectOptions) -> Result<Arc<ObjectClient>, DataError> {
        let rt = BlockingRuntime::new("sparta-objects")
            .map_err(|e| DataError::Internal(e.to_string()))?;
        Ok(Arc::new(ObjectClient {
            opts,
            rt,
            stores: Mutex::new(HashMap::new()),
        }))
    }

    /// A client over an existing store for every `s3://` bucket (tests: `object_store`'s
    /// in-memory store).
    pub fn with_store(
        opts: ObjectOptions,
        bucket: &str,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Arc<ObjectClient>, DataError> {
        let client = ObjectClient::new(opts)?;
        client.stores.lock().insert(
            StoreId::S3 {
                bucket: bucket.to_string(),
            },
            store,
        );
        Ok(client)
    }

    pub(crate) fn options(&self) -> &ObjectOptions {
        &self.opts
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.rt.handle()
    }

    /// Runs `fut` on the client's runtime and waits for it (from a non-runtime thread).
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> io::Result<T> {
        self.rt.block_on(fut).map_err(io::Error::other)
    }

    fn store(&self, id: &StoreId, url: &str) -> Result<Arc<dyn ObjectStore>, DataError> {
        let mut stores = self.stores.lock();
        if let Some(s) = stores.get(id) {
            return Ok(Arc::clone(s));
        }
        let store = store::open(id, &self.opts.s3_options()).map_err(|e| DataError::Io {
            path: PathBuf::from(url),
            source: match e {
                BlobError::Store { source, .. } => io::Error::other(source),
                other => io::Error::other(other),
            },
        })?;
        stores.insert(id.clone(), Arc::clone(&store));
        Ok(store)
    }

    /// The objects an input URL names, in name order (see the module docs). An URL that
    /// names nothing is [`DataError::NotFound`].
    pub fn expand(&self, url: &Path) -> Result<Vec<ObjectEntry>, DataError> {
        let text = url.to_string_lossy().into_owned();
        let parsed = parse(&text)?;
        let store = self.store(&parsed.store, &text)?;
        let base = url_base(&text, &parsed.key);
        let glob_at = parsed.key.find(['*', '?', '[']);
        let (prefix, matcher) = match glob_at {
            Some(at) => {
                let prefix = parsed.key[..at].rfind('/').map_or("", |p| &parsed.key[..p]);
                let glob = globset::GlobBuilder::new(&parsed.key)
                    .literal_separator(true)
                    .build()
                    .map_err(|e| DataError::Config(format!("input `{text}`: bad glob: {e}")))?
                    .compile_matcher();
                (prefix.to_string(), Some(glob))
            }
            None => (parsed.key.trim_end_matches('/').to_string(), None),
        };
        // One exact object first (no glob, no trailing slash).
        if matcher.is_none() && !parsed.key.ends_with('/') && !parsed.key.is_empty() {
            let key = obj_path(&text, &parsed.key)?;
            let st = Arc::clone(&store);
            match self.retrying(&text, move || {
                let (st, key) = (Arc::clone(&st), key.clone());
                async move { st.head(&key).await }
            }) {
                Ok(meta) => return Ok(vec![entry(&base, &meta)]),
                Err(DataError::NotFound { .. }) => {} // maybe a prefix
                Err(e) => return Err(e),
            }
        }
        let list_prefix = if prefix.is_empty() {
            None
        } else {
            Some(obj_path(&text, &prefix)?)
        };
        let st = Arc::clone(&store);
        let mut metas = self.retrying(&text, move || {
            let (st, p) = (Arc::clone(&st), list_prefix.clone());
            async move { st.list(p.as_ref()).try_collect::<Vec<ObjectMeta>>().await }
        })?;
        if let Some(m) = &matcher {
            metas.retain(|o| m.is_match(o.location.as_ref()));
        }
        // Hidden and temporary objects, as for a followed directory.
        metas.retain(|o| {
            o.location
                .filename()
                .is_some_and(|n| !n.starts_with('.') && !n.ends_with(".tmp"))
        });
        metas.sort_by(|a, b| a.location.cmp(&b.location));
        if metas.is_empty() {
            return Err(DataError::NotFound {
                path: url.to_path_buf(),
            });
        }
        Ok(metas.iter().map(|m| entry(&base, m)).collect())
    }

    /// The objects directly under a prefix (not in deeper "directories"), in name order, as
    /// `(name, size)`: the listing of a followed prefix.
    pub fn list_dir(&self, url: &Path) -> Result<Vec<(String, u64)>, DataError> {
        let text = url.to_string_lossy().into_owned();
        let parsed = parse(&text)?;
        let store = self.store(&parsed.store, &text)?;
        let key = parsed.key.trim_end_matches('/').to_string();
        let prefix = if key.is_empty() {
            None
        } else {
            Some(obj_path(&text, &key)?)
        };
        let listed = self.retrying(&text, move || {
            let (st, p) = (Arc::clone(&store), prefix.clone());
            async move { st.list_with_delimiter(p.as_ref()).await }
        })?;
        let mut out: Vec<(String, u64)> = listed
            .objects
            .iter()
            .filter_map(|o| Some((o.location.filename()?.to_string(), o.size)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Opens one object for ranged reads (a HEAD request for its size and ETag).
    pub fn open(self: &Arc<Self>, url: &Path) -> Result<ObjectRange, DataError> {
        let text = url.to_string_lossy().into_owned();
        let parsed = parse(&text)?;
        let store = self.store(&parsed.store, &text)?;
        let key = obj_path(&text, &parsed.key)?;
        let (st, k) = (Arc::clone(&store), key.clone());
        let meta = self.retrying(&text, move || {
            let (st, k) = (Arc::clone(&st), k.clone());
            async move { st.head(&k).await }
        })?;
        Ok(ObjectRange::new(
            Arc::clone(self),
            store,
            key,
            url.to_path_buf(),
            meta.size,
            meta.e_tag,
        ))
    }

    /// Opens listed objects (sizes and ETags from the listing: no HEAD) and fetches the first
    /// `probe` bytes of each, up to [`OPEN_CONCURRENCY`] at once, so opening many objects
    /// costs a few round trips rather than one per object. Each object with its first bytes.
    pub fn open_listed(
        self: &Arc<Self>,
        entries: &[ObjectEntry],
        probe: usize,
    ) -> Result<Vec<(ObjectRange, bytes::Bytes)>, DataError> {
        use futures::StreamExt;
        let mut opened = Vec::with_capacity(entries.len());
        let mut fetches = Vec::with_capacity(entries.len());
        for e in entries {
            let text = e.url.to_string_lossy().into_owned();
            let parsed = parse(&text)?;
            let store = self.store(&parsed.store, &text)?;
            let key = obj_path(&text, &parsed.key)?;
            let end = (probe as u64).min(e.size);
            let (st, k, tag, opts) = (
                Arc::clone(&store),
                key.clone(),
                e.e_tag.clone(),
                self.opts.clone(),
            );
            fetches.push(async move {
                if end == 0 {
                    return Ok(bytes::Bytes::new());
                }
                range::fetch(&opts, None, st, k, tag, 0..end).await
            });
            opened.push(ObjectRange::new(
                Arc::clone(self),
                store,
                key,
                e.url.clone(),
                e.size,
                e.e_tag.clone(),
            ));
        }
        let heads = self
            .block_on(async move {
                futures::stream::iter(fetches)
                    .buffered(OPEN_CONCURRENCY)
                    .collect::<Vec<_>>()
                    .await
            })
            .map_err(|source| DataError::Internal(format!("opening objects: {source}")))?;
        opened
            .into_iter()
            .zip(heads)
            .map(|(o, head)| match head {
                Ok(b) => Ok((o, b)),
                Err(e) => Err(object_error(o.url(), e)),
            })
            .collect()
    }

    /// Runs a request with the retry policy of ranged reads (listing, HEAD).
    fn retrying<T, F, Fut>(&self, url: &str, op: F) -> Result<T, DataError>
    where
        T: Send + 'static,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = object_store::Result<T>> + Send + 'static,
    {
        let opts = self.opts.clone();
        let path = PathBuf::from(url);
        let res = self
            .block_on(async move { range::with_retries(&opts, None, op).await })
            .map_err(|source| DataError::Io {
                path: path.clone(),
                source,
            })?;
        res.map_err(|e| object_error(&path, e))
    }
}

/// The URL prefix that object keys are appended to (`s3://bucket/`, `file:///`).
fn url_base(url: &str, key: &str) -> String {
    url[..url.len() - key.len()].to_string()
}

fn entry(base: &str, meta: &ObjectMeta) -> ObjectEntry {
    ObjectEntry {
        url: PathBuf::from(format!("{base}{}", meta.location)),
        size: meta.size,
        e_tag: meta.e_tag.clone(),
    }
}

fn obj_path(url: &str, key: &str) -> Result<ObjPath, DataError> {
    ObjPath::parse(key).map_err(|e| DataError::Config(format!("input `{url}`: bad key: {e}")))
}

/// A store error as a [`DataError`] naming the object: not found, access denied and the rest.
pub(crate) fn object_error(path: &Path, e: object_store::Error) -> DataError {
    match e {
        object_store::Error::NotFound { .. } => DataError::NotFound {
            path: path.to_path_buf(),
        },
        object_store::Error::PermissionDenied { source, .. }
        | object_store::Error::Unauthenticated { source, .. } => DataError::Io {
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("access denied (check the credentials and the bucket policy): {source}"),
            ),
        },
        object_store::Error::Precondition { .. } => DataError::Changed {
            path: path.to_path_buf(),
            detail: "the object was replaced while read (its ETag changed)".into(),
        },
        other => DataError::Io {
            path: path.to_path_buf(),
            source: io::Error::other(other),
        },
    }
}

#[cfg(test)]
mod tests;
