//! Object URLs: the one parser of `s3://bucket/key` and `file:///abs/path` in the workspace.
//!
//! A string is a URL when it starts with `scheme://`, the scheme a letter followed by letters,
//! digits, `+`, `-` or `.` ([`split_url`]); anything else is a local path. [`ObjectUrl::parse`]
//! splits a URL into its store ([`StoreId`]: an S3 bucket or the local file system) and the
//! key (or key prefix, or key pattern) inside it:
//!
//! | URL | store | key |
//! |-----|-------|-----|
//! | `s3://bkt/logs/a.tsv`, `s3a://bkt/logs/a.tsv` | `S3 { bucket: "bkt" }` | `logs/a.tsv` |
//! | `s3://bkt`, `s3://bkt/` | `S3 { bucket: "bkt" }` | empty |
//! | `file:///data/x`, `file://localhost/data/x` | `File` | `data/x` (the path without its `/`) |
//!
//! Schemes are matched case-insensitively. The key is kept as written (trailing `/`, glob
//! characters): what it means is up to the caller (an input prefix, a checkpoint location).

use crate::error::{BlobError, UrlError};

/// `(scheme, rest)` of `scheme://rest` when `s` starts with a syntactically valid scheme (a
/// letter, then letters, digits, `+`, `-`, `.`); `None` for anything else (a local path).
pub fn split_url(s: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = s.split_once("://")?;
    let mut b = scheme.bytes();
    let ok = b.next().is_some_and(|c| c.is_ascii_alphabetic())
        && b.all(|c| c.is_ascii_alphanumeric() || b"+-.".contains(&c));
    ok.then_some((scheme, rest))
}

/// Whether `s` is a URL (`scheme://...`) rather than a local path.
pub fn is_url(s: &str) -> bool {
    split_url(s).is_some()
}

/// The store an object URL lives in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StoreId {
    /// An S3 (or S3-compatible) bucket.
    S3 {
        /// The bucket name (not validated beyond being non-empty).
        bucket: String,
    },
    /// The local file system; keys are absolute paths without their leading `/`.
    File,
}

/// A parsed object URL (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    /// Where the object lives.
    pub store: StoreId,
    /// The key inside the store, as written (may be empty, end in `/` or hold a glob).
    pub key: String,
}

impl ObjectUrl {
    /// Parses `url`; the error names it and says what is wrong ([`UrlError`]).
    pub fn parse(url: &str) -> Result<ObjectUrl, BlobError> {
        let bad = |kind| BlobError::Url {
            url: url.to_string(),
            kind,
        };
        let (scheme, rest) = split_url(url).ok_or_else(|| bad(UrlError::NotAUrl))?;
        match scheme.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(bad(UrlError::NoBucket));
                }
                Ok(ObjectUrl {
                    store: StoreId::S3 {
                        bucket: bucket.to_string(),
                    },
                    key: key.to_string(),
                })
            }
            "file" => {
                // `file:///abs` (empty host) or `file://localhost/abs`.
                let path = rest.strip_prefix("localhost").unwrap_or(rest);
                let key = path
                    .strip_prefix('/')
                    .ok_or_else(|| bad(UrlError::NotAbsolute))?;
                Ok(ObjectUrl {
                    store: StoreId::File,
                    key: key.to_string(),
                })
            }
            other => Err(bad(UrlError::UnsupportedScheme(other.to_string()))),
        }
    }

    /// The absolute path of a `file://` URL (`/` + key); `None` for other stores.
    pub fn local_path(&self) -> Option<std::path::PathBuf> {
        match self.store {
            StoreId::File => Some(std::path::PathBuf::from(format!("/{}", self.key))),
            StoreId::S3 { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, key: &str) -> ObjectUrl {
        ObjectUrl {
            store: StoreId::S3 {
                bucket: bucket.into(),
            },
            key: key.into(),
        }
    }

    fn file(key: &str) -> ObjectUrl {
        ObjectUrl {
            store: StoreId::File,
            key: key.into(),
        }
    }

    #[test]
    fn splits_urls_and_leaves_paths_alone() {
        assert_eq!(split_url("s3://b/k"), Some(("s3", "b/k")));
        assert_eq!(split_url("git+ssh://h/x"), Some(("git+ssh", "h/x")));
        assert_eq!(split_url("file:///a"), Some(("file", "/a")));
        for path in [
            "/data/x",
            "rel/x",
            "./odd://name",
            "C:\\x",
            "1s3://b",
            "://x",
            "",
        ] {
            assert_eq!(split_url(path), None, "{path}");
            assert!(!is_url(path), "{path}");
        }
        assert!(is_url("s3://b"));
    }

    #[test]
    fn parses_s3_and_file_urls() {
        let cases = [
            ("s3://bkt/logs/a.tsv", s3("bkt", "logs/a.tsv")),
            ("S3://bkt/logs/", s3("bkt", "logs/")),
            ("s3a://bkt/p", s3("bkt", "p")),
            ("s3://bkt", s3("bkt", "")),
            ("s3://bkt/", s3("bkt", "")),
            ("s3://bkt/day=*/part-?.gz", s3("bkt", "day=*/part-?.gz")),
            ("file:///data/x", file("data/x")),
            ("FILE:///x", file("x")),
            ("file://localhost/data", file("data")),
            ("file:///", file("")),
        ];
        for (text, want) in cases {
            assert_eq!(ObjectUrl::parse(text).unwrap(), want, "{text}");
        }
        assert_eq!(
            ObjectUrl::parse("file:///d/e").unwrap().local_path(),
            Some("/d/e".into())
        );
        assert_eq!(s3("b", "k").local_path(), None);
    }

    #[test]
    fn errors_name_the_url_and_what_is_wrong() {
        for (text, kind, needle) in [
            ("/local/path", UrlError::NotAUrl, "not a URL"),
            (
                "gs://bkt/x",
                UrlError::UnsupportedScheme("gs".into()),
                "unsupported scheme `gs://`",
            ),
            (
                "HTTP://h/x",
                UrlError::UnsupportedScheme("http".into()),
                "unsupported scheme `http://`",
            ),
            ("s3://", UrlError::NoBucket, "no bucket"),
            ("s3:///key", UrlError::NoBucket, "no bucket"),
            ("file://relative/x", UrlError::NotAbsolute, "absolute path"),
        ] {
            let err = ObjectUrl::parse(text).unwrap_err();
            match &err {
                BlobError::Url { url, kind: k } => {
                    assert_eq!(url, text);
                    assert_eq!(k, &kind, "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
            let msg = err.to_string();
            assert!(msg.contains(&format!("`{text}`")), "{msg}");
            assert!(msg.contains(needle), "{text}: `{msg}` lacks `{needle}`");
        }
    }
}
