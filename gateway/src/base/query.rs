//! Query parameters of list, watch, write and delete requests, parsed and checked once.

use std::collections::HashMap;

use svc_core::ApiError;
use svc_core::status::StatusCause;

/// The raw query, decoded.
#[derive(Debug, Default)]
pub struct Query {
    first: HashMap<String, String>,
    all: Vec<(String, String)>,
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        let mut q = Query::default();
        if let Some(raw) = raw {
            for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
                // The first value wins, as Go's url.Values.Get does.
                q.first
                    .entry(k.to_string())
                    .or_insert_with(|| v.to_string());
                q.all.push((k.into_owned(), v.into_owned()));
            }
        }
        q
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.first.get(key).map(String::as_str)
    }

    /// Every value of a repeated parameter (`exclude=a&exclude=b`).
    pub fn get_all(&self, key: &str) -> Vec<&str> {
        self.all
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn has(&self, key: &str) -> bool {
        self.first.contains_key(key)
    }

    /// A boolean parameter in Go's `strconv.ParseBool` forms; a bare `?watch` means true.
    pub fn bool(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None => Ok(false),
            Some("" | "1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid boolean value {other:?} for query parameter {key:?}"
            ))),
        }
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid integer value {v:?} for query parameter {key:?}"
                ))
            }),
        }
    }

    pub fn pretty(&self) -> bool {
        self.bool("pretty").unwrap_or(false)
    }

    /// `dryRun`: every value `All`, or none. Anything else is the cause of a 422 of the
    /// write's options (the caller knows which: `CreateOptions`, ...), as Kubernetes'
    /// `ValidateDryRun` says it.
    pub fn dry_run(&self) -> Result<bool, StatusCause> {
        dry_run(&self.get_all("dryRun"))
    }
}

/// `dryRun` from its values (the query's, or a DeleteOptions body's).
pub fn dry_run<S: AsRef<str>>(values: &[S]) -> Result<bool, StatusCause> {
    let values: Vec<&str> = values
        .iter()
        .map(AsRef::as_ref)
        .filter(|v| !v.is_empty())
        .collect();
    if values.iter().all(|v| *v == "All") {
        return Ok(!values.is_empty());
    }
    Err(StatusCause {
        reason: "FieldValueNotSupported".into(),
        message: format!(
            "Unsupported value: {}: supported values: \"All\"",
            serde_json::to_string(&values).unwrap_or_default()
        ),
        field: "dryRun".into(),
    })
}

/// `resourceVersionMatch` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    Exact,
    NotOlderThan,
}

/// The LIST parameter set.
#[derive(Debug, Default)]
pub struct ListOptions {
    pub label_selector: String,
    pub field_selector: String,
    pub watch: bool,
    pub allow_watch_bookmarks: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<RvMatch>,
    pub limit: Option<i64>,
    pub continue_token: Option<String>,
    pub timeout_seconds: Option<i64>,
    pub send_initial_events: Option<bool>,
}

impl ListOptions {
    pub fn from_query(q: &Query) -> Result<Self, ApiError> {
        let resource_version_match = match q.get("resourceVersionMatch") {
            None | Some("") => None,
            Some("Exact") => Some(RvMatch::Exact),
            Some("NotOlderThan") => Some(RvMatch::NotOlderThan),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \
                     \"Exact\", \"NotOlderThan\""
                )));
            }
        };
        let limit = q.int("limit")?.filter(|l| *l > 0);
        let timeout_seconds = q.int("timeoutSeconds")?;
        if timeout_seconds.is_some_and(|t| t < 0) {
            return Err(ApiError::bad_request(
                "timeoutSeconds: Invalid value: must be non-negative",
            ));
        }
        Ok(ListOptions {
            label_selector: q.get("labelSelector").unwrap_or_default().to_string(),
            field_selector: q.get("fieldSelector").unwrap_or_default().to_string(),
            watch: q.bool("watch")?,
            allow_watch_bookmarks: q.bool("allowWatchBookmarks")?,
            resource_version: q
                .get("resourceVersion")
                .filter(|v| !v.is_empty())
                .map(str::to_string),
            resource_version_match,
            limit,
            continue_token: q
                .get("continue")
                .filter(|v| !v.is_empty())
                .map(str::to_string),
            timeout_seconds,
            send_initial_events: if q.has("sendInitialEvents") {
                Some(q.bool("sendInitialEvents")?)
            } else {
                None
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_list_parameters() {
        let q = Query::parse(Some(
            "watch=1&labelSelector=app%3Dweb&limit=5&resourceVersion=&timeoutSeconds=30",
        ));
        let o = ListOptions::from_query(&q).unwrap();
        assert!(o.watch);
        assert_eq!(o.label_selector, "app=web");
        assert_eq!(o.limit, Some(5));
        assert_eq!(o.resource_version, None);
        assert_eq!(o.timeout_seconds, Some(30));
        assert!(ListOptions::from_query(&Query::parse(Some("watch=maybe"))).is_err());
        assert!(ListOptions::from_query(&Query::parse(Some("limit=x"))).is_err());
        assert!(
            ListOptions::from_query(&Query::parse(Some("resourceVersionMatch=Newest"))).is_err()
        );
        assert!(Query::parse(Some("watch")).bool("watch").unwrap());
        let bad = Query::parse(Some("dryRun=Some")).dry_run().unwrap_err();
        assert_eq!(
            (
                bad.reason.as_str(),
                bad.field.as_str(),
                bad.message.as_str()
            ),
            (
                "FieldValueNotSupported",
                "dryRun",
                "Unsupported value: [\"Some\"]: supported values: \"All\""
            )
        );
        assert!(Query::parse(Some("dryRun=All")).dry_run().unwrap());
        assert!(!Query::parse(Some("dryRun=")).dry_run().unwrap());
        assert!(!Query::parse(None).dry_run().unwrap());
    }
}
