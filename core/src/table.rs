//! The `Table` representation (`meta.svc.io/v1`): rows of cells, `Name` and then the kind's
//! own columns or Kubernetes' default `Created At`, each row with the object as
//! `includeObject` asks. A kind whose columns include one of format `name` places the name
//! itself (Events show it last, at priority 1, as Kubernetes does).

use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::meta::ListMeta;
use crate::resource::ResourceInfo;
use crate::status::ApiError;

pub const TABLE_API_VERSION: &str = "meta.svc.io/v1";

/// What each row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    /// A `PartialObjectMetadata` (the default, as in Kubernetes).
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(ApiError::bad_request(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"None\", \
                 \"Metadata\", \"Object\""
            ))),
        }
    }
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. It is required when \
    creating resources, although some resources may allow a client to request the generation of \
    an appropriate name automatically.";

/// Whether the kind's own columns include the name, so no leading `Name` column is added.
fn places_name(info: &ResourceInfo) -> bool {
    info.columns.iter().any(|c| c.format == "name")
}

/// The column definitions: `Name` (unless the kind places it), then the kind's own columns or
/// Kubernetes' default `Created At`.
fn columns(info: &ResourceInfo) -> Value {
    let mut cols = Vec::new();
    if !places_name(info) {
        cols.push(json!({"name": "Name", "type": "string", "format": "name",
            "priority": 0, "description": NAME_DESCRIPTION}));
    }
    if info.columns.is_empty() {
        cols.push(
            json!({"name": "Created At", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when \
                            this object was created."}),
        );
    }
    for c in info.columns {
        cols.push(json!({"name": c.name, "type": c.ty, "format": c.format,
            "priority": c.priority, "description": c.description}));
    }
    Value::Array(cols)
}

fn row(info: &ResourceInfo, object: Value, include: IncludeObject, now: OffsetDateTime) -> Value {
    let meta = object.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let mut cells = Vec::new();
    if !places_name(info) {
        cells.push(
            meta.get("name")
                .cloned()
                .unwrap_or(Value::String(String::new())),
        );
    }
    if info.columns.is_empty() {
        cells.push(
            meta.get("creationTimestamp")
                .cloned()
                .unwrap_or(Value::Null),
        );
    }
    cells.extend(info.columns.iter().map(|c| (c.cell)(&object, now)));
    let mut r = serde_json::Map::new();
    r.insert("cells".into(), Value::Array(cells));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r.insert("object".into(), json!({"kind": "PartialObjectMetadata", "apiVersion": TABLE_API_VERSION, "metadata": meta}));
        }
        IncludeObject::Object => {
            r.insert("object".into(), object);
        }
    }
    Value::Object(r)
}

/// A table of `info`'s objects given as JSON values, with the list's metadata; ages are
/// counted up to `now`.
pub fn table(
    info: &ResourceInfo,
    meta: &ListMeta,
    objects: Vec<Value>,
    include: IncludeObject,
    now: OffsetDateTime,
) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": TABLE_API_VERSION,
        "metadata": meta,
        "columnDefinitions": columns(info),
        "rows": objects.into_iter().map(|o| row(info, o, include, now)).collect::<Vec<_>>(),
    })
}

/// The `Age` cell Kubernetes' printers show: the time since `timestamp` (RFC 3339) in the
/// largest one or two units (`45s`, `3m20s`, `5h`, `12d`); `<unknown>` without one.
pub fn age(timestamp: Option<&str>, now: time::OffsetDateTime) -> String {
    let Some(t) = timestamp.and_then(|t| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    }) else {
        return "<unknown>".into();
    };
    let nanos = now
        .unix_timestamp_nanos()
        .saturating_sub(t.unix_timestamp_nanos());
    let secs = i64::try_from(nanos / 1_000_000_000)
        .unwrap_or(i64::MAX)
        .max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{m}m{}s", s % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if d < 2 => format!("{h}h"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

/// A duration as Kubernetes' printers show it (`duration.HumanDuration`): two or three
/// significant figures (`90s`, `9m5s`, `150m`, `4h30m`, `3d2h`, `2y45d`).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    let days = hours / 24;
    match hours {
        h if h < 8 => match minutes % 60 {
            0 => format!("{h}h"),
            m => format!("{h}h{m}m"),
        },
        h if h < 48 => format!("{h}h"),
        h if h < 24 * 8 => match h % 24 {
            0 => format!("{days}d"),
            rem => format!("{days}d{rem}h"),
        },
        h if h < 24 * 365 * 2 => format!("{days}d"),
        h if h < 24 * 365 * 8 => match days % 365 {
            0 => format!("{}y", days / 365),
            rem => format!("{}y{rem}d", days / 365),
        },
        _ => format!("{}y", days / 365),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Resource;

    #[test]
    fn default_columns_and_rows() {
        let obj = json!({"kind": "ServiceAccount", "metadata": {"name": "a", "creationTimestamp": "2024-01-02T03:04:05Z", "uid": "u"}});
        let meta = ListMeta {
            resource_version: "7".into(),
            ..Default::default()
        };
        let info = crate::kinds::ServiceAccount::INFO;
        let t = table(
            info,
            &meta,
            vec![obj.clone()],
            IncludeObject::Metadata,
            OffsetDateTime::now_utc(),
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.svc.io/v1");
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert_eq!(t["columnDefinitions"][1]["type"], "date");
        assert_eq!(t["rows"][0]["cells"], json!(["a", "2024-01-02T03:04:05Z"]));
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["uid"], "u");
        assert_eq!(t["metadata"]["resourceVersion"], "7");
        let none = table(
            info,
            &meta,
            vec![obj.clone()],
            IncludeObject::None,
            OffsetDateTime::now_utc(),
        );
        assert!(none["rows"][0].get("object").is_none());
        let full = table(
            info,
            &meta,
            vec![obj.clone()],
            IncludeObject::Object,
            OffsetDateTime::now_utc(),
        );
        assert_eq!(full["rows"][0]["object"], obj);
        assert!(IncludeObject::parse(Some("Everything")).is_err());
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = time::macros::datetime!(2024-01-10 00:00:00 UTC);
        for (t, want) in [
            ("2024-01-09T23:59:15Z", "45s"),
            ("2024-01-09T23:56:40Z", "3m20s"),
            ("2024-01-09T23:00:00Z", "60m"),
            ("2024-01-09T19:30:00Z", "4h30m"),
            ("2024-01-09T00:00:00Z", "24h"),
            ("2024-01-07T00:00:00Z", "3d0h"),
            ("2023-12-01T00:00:00Z", "40d"),
        ] {
            assert_eq!(age(Some(t), now), want, "{t}");
        }
        assert_eq!(age(None, now), "<unknown>");
    }

    #[test]
    fn durations_read_like_kubectl() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (90, "90s"),
            (600, "10m"),
            (545, "9m5s"),
            (3600, "60m"),
            (9000, "150m"),
            (16200, "4h30m"),
            (86400, "24h"),
            (3 * 86400, "3d"),
            (3 * 86400 + 7200, "3d2h"),
            (365 * 86400, "365d"),
            (8760 * 3600 * 3 + 45 * 86400, "3y45d"),
            (8760 * 3600 * 10, "10y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }
}
