//! ObjectMeta, ListMeta and the time formats of the API, wire-identical to Kubernetes.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A timestamp serialized as RFC 3339 with second precision (`2006-01-02T15:04:05Z`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub OffsetDateTime);

impl Time {
    pub fn now() -> Self {
        let now = OffsetDateTime::now_utc();
        Time(now.replace_nanosecond(0).unwrap_or(now))
    }

    pub fn to_rfc3339(&self) -> String {
        let t = self.0.to_offset(time::UtcOffset::UTC);
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        )
    }

    /// Seconds since the Unix epoch.
    pub fn unix(&self) -> i64 {
        self.0.unix_timestamp()
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        OffsetDateTime::parse(&s, &Rfc3339)
            .map(Time)
            .map_err(|e| serde::de::Error::custom(format!("invalid time {s:?}: {e}")))
    }
}

/// A timestamp with microsecond precision (`2006-01-02T15:04:05.000000Z`), used by Events.
/// Finer digits are dropped on the way in, as Kubernetes' `MicroTime` truncates them, so a
/// value compares equal to what it reads back as.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MicroTime(pub OffsetDateTime);

impl MicroTime {
    /// `t` truncated to whole microseconds.
    pub fn new(t: OffsetDateTime) -> Self {
        let micros = (t.nanosecond() / 1_000).saturating_mul(1_000);
        MicroTime(t.replace_nanosecond(micros).unwrap_or(t))
    }

    pub fn now() -> Self {
        MicroTime::new(OffsetDateTime::now_utc())
    }

    /// RFC 3339 in UTC with exactly six fractional digits (Kubernetes' `RFC3339Micro`).
    pub fn to_rfc3339(&self) -> String {
        let t = self.0.to_offset(time::UtcOffset::UTC);
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.microsecond()
        )
    }

    /// Seconds since the Unix epoch, and the microseconds after them (in nanoseconds).
    pub fn unix(&self) -> (i64, i32) {
        let nanos = i32::try_from(self.0.nanosecond()).unwrap_or(0);
        (self.0.unix_timestamp(), nanos)
    }
}

impl Serialize for MicroTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for MicroTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        OffsetDateTime::parse(&s, &Rfc3339)
            .map(MicroTime::new)
            .map_err(|e| serde::de::Error::custom(format!("invalid time {s:?}: {e}")))
    }
}

/// `apiVersion` and `kind`, the type header of every object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeMeta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

/// One field-ownership record of server-side apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFieldsEntry {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manager: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fields_type: String,
    #[serde(default, rename = "fieldsV1", skip_serializing_if = "Option::is_none")]
    pub fields_v1: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// Standard object metadata. Field order follows Kubernetes so output reads the same.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generate_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub self_link: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

/// Metadata of a collection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub self_link: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, rename = "continue", skip_serializing_if = "String::is_empty")]
    pub continue_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_item_count: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trips_in_kubernetes_format() {
        let t: Time = serde_json::from_str("\"2024-03-05T07:08:09Z\"").unwrap();
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"2024-03-05T07:08:09Z\""
        );
        let offset: Time = serde_json::from_str("\"2024-03-05T08:08:09+01:00\"").unwrap();
        assert_eq!(offset.to_rfc3339(), "2024-03-05T07:08:09Z");
        assert!(serde_json::from_str::<Time>("\"yesterday\"").is_err());
    }

    #[test]
    fn micro_time_keeps_microseconds() {
        let t: MicroTime = serde_json::from_str("\"2024-03-05T07:08:09.123456Z\"").unwrap();
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"2024-03-05T07:08:09.123456Z\""
        );
        // Six digits always, in UTC; finer ones are dropped, so values read back equal.
        for (input, want) in [
            ("2024-03-05T07:08:09Z", "2024-03-05T07:08:09.000000Z"),
            ("2024-03-05T08:08:09.5+01:00", "2024-03-05T07:08:09.500000Z"),
            (
                "2024-03-05T07:08:09.123456789Z",
                "2024-03-05T07:08:09.123456Z",
            ),
        ] {
            let t: MicroTime = serde_json::from_str(&format!("{input:?}")).unwrap();
            assert_eq!(t.to_rfc3339(), want, "{input}");
            let back: MicroTime = serde_json::from_str(&format!("{want:?}")).unwrap();
            assert_eq!(back, t, "{input}");
        }
        assert_eq!(MicroTime::now().0.nanosecond() % 1_000, 0);
        assert!(serde_json::from_str::<MicroTime>("\"soon\"").is_err());
    }

    #[test]
    fn empty_meta_serializes_to_empty_object() {
        assert_eq!(serde_json::to_string(&ObjectMeta::default()).unwrap(), "{}");
        let lm = ListMeta {
            continue_: "abc".into(),
            ..Default::default()
        };
        assert_eq!(serde_json::to_string(&lm).unwrap(), r#"{"continue":"abc"}"#);
    }
}
