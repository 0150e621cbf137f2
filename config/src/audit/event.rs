//! The audit Event and EventList (`audit.svc.io/v1`) as backends receive them, with the
//! request and response bodies kept as the JSON that was sent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{API_VERSION, Level, Stage};
use crate::ConfigKind;
use svc_core::meta::MicroTime;
use svc_core::user::UserInfo;
use svc_core::validation::ErrorList;

/// The object an event is about (absent for lists and non-resource requests).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, rename = "apiGroup", skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The `Status` of a response as an event carries it: the code, and for errors the
/// message, reason and details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResponseStatus {
    #[serde(default)]
    pub metadata: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    #[serde(default)]
    pub code: u16,
}

/// One audit event: a request at one stage.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: String,
    pub api_version: String,
    pub level: Level,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: Stage,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<UserInfo>,
    #[serde(default, rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    /// The body as sent (Request level and up).
    #[serde(default)]
    pub request_object: Option<RawJson>,
    /// The response body (RequestResponse level).
    #[serde(default)]
    pub response_object: Option<RawJson>,
    pub request_received_timestamp: MicroTime,
    pub stage_timestamp: MicroTime,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An [`Event`]'s fields as written, borrowed; the raw objects only when asked for.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EventFields<'a> {
    kind: &'a str,
    api_version: &'a str,
    level: Level,
    #[serde(rename = "auditID")]
    audit_id: &'a str,
    stage: Stage,
    #[serde(rename = "requestURI")]
    request_uri: &'a str,
    verb: &'a str,
    user: &'a UserInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    impersonated_user: Option<&'a UserInfo>,
    #[serde(rename = "sourceIPs", skip_serializing_if = "<[String]>::is_empty")]
    source_ips: &'a [String],
    #[serde(skip_serializing_if = "str::is_empty")]
    user_agent: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    object_ref: Option<&'a ObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_status: Option<&'a ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_object: Option<&'a RawJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_object: Option<&'a RawJson>,
    request_received_timestamp: MicroTime,
    stage_timestamp: MicroTime,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: &'a BTreeMap<String, String>,
}

impl Event {
    fn fields(&self, with_objects: bool) -> EventFields<'_> {
        EventFields {
            kind: &self.kind,
            api_version: &self.api_version,
            level: self.level,
            audit_id: &self.audit_id,
            stage: self.stage,
            request_uri: &self.request_uri,
            verb: &self.verb,
            user: &self.user,
            impersonated_user: self.impersonated_user.as_ref(),
            source_ips: &self.source_ips,
            user_agent: &self.user_agent,
            object_ref: self.object_ref.as_ref(),
            response_status: self.response_status.as_ref(),
            request_object: self.request_object.as_ref().filter(|_| with_objects),
            response_object: self.response_object.as_ref().filter(|_| with_objects),
            request_received_timestamp: self.request_received_timestamp,
            stage_timestamp: self.stage_timestamp,
            annotations: &self.annotations,
        }
    }

    /// The event as one line of JSON (no newline), with `requestObject` and
    /// `responseObject` spliced in as they were sent rather than re-encoded.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(&self.fields(false)).unwrap_or_else(|_| b"{}".to_vec());
        for (key, raw) in [
            ("requestObject", &self.request_object),
            ("responseObject", &self.response_object),
        ] {
            if let Some(raw) = raw {
                out.pop(); // the closing brace
                out.extend_from_slice(format!(",\"{key}\":").as_bytes());
                out.extend_from_slice(raw.0.as_bytes());
                out.push(b'}');
            }
        }
        out
    }
}

/// Through serde the raw objects are re-encoded ([`Event::to_json`] does not).
impl Serialize for Event {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.fields(true).serialize(s)
    }
}

impl ConfigKind for Event {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = "Event";

    /// The fields every event has.
    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        for (field, value) in [
            ("auditID", &self.audit_id),
            ("requestURI", &self.request_uri),
            ("verb", &self.verb),
        ] {
            if value.is_empty() {
                errors.required(field, "");
            }
        }
        errors
    }
}

/// JSON text kept as it was written (one valid JSON value, checked on the way in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawJson(String);

impl RawJson {
    /// `bytes` if they hold exactly one JSON value.
    pub fn new(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes).ok()?;
        let text = std::str::from_utf8(bytes).ok()?;
        Some(RawJson(text.trim().to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for RawJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::from_str::<Value>(&self.0)
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(RawJson(Value::deserialize(d)?.to_string()))
    }
}

/// A batch of events, as webhook backends receive them.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventList {
    pub kind: String,
    pub api_version: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, Value>,
    pub items: Vec<Event>,
}

impl EventList {
    /// The list as JSON, each item written by [`Event::to_json`].
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = format!(
            "{{\"kind\":\"EventList\",\"apiVersion\":\"{API_VERSION}\",\"metadata\":{{}},\"items\":["
        )
        .into_bytes();
        for (i, ev) in self.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&ev.to_json());
        }
        out.extend_from_slice(b"]}");
        out
    }

    pub fn new(items: Vec<Event>) -> Self {
        EventList {
            kind: "EventList".into(),
            api_version: API_VERSION.into(),
            metadata: BTreeMap::new(),
            items,
        }
    }
}

/// `body` without `metadata.managedFields` (of the object, or of each item of a list), for
/// `omitManagedFields`; None when it is not a JSON object or has none to drop.
pub fn without_managed_fields(body: &[u8]) -> Option<Vec<u8>> {
    if !contains(body, b"\"managedFields\"") {
        return None;
    }
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let strip = |o: &mut Value| {
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    };
    strip(&mut v);
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
    serde_json::to_vec(&v).ok()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
