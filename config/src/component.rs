//! Types shared by the component configurations (proxy, scheduler, controller manager):
//! client connection, leader election, debugging and logging, with Kubernetes' recommended
//! defaults and component-base's rules; plus the small checks they share (CIDRs, host:port).

use std::collections::BTreeMap;
// Addresses are parsed, never bound: `core::net` holds the types without the sockets.
use core::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Duration, Path};
use svc_core::validation::ErrorList;

/// A written `null` read as the field's zero value, as Go's JSON decoding reads it into a
/// non-pointer field (so `iptables: null` is the same as leaving `iptables` out).
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Our protobuf media type, Kubernetes' `application/vnd.kubernetes.protobuf`.
pub const PROTOBUF_CONTENT_TYPE: &str = "application/vnd.svc.protobuf";

/// How a component talks to the API server. `qps` and `burst` of 0 mean "use the component's
/// default", as in Kubernetes (the fields are not pointers there).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientConnectionConfiguration {
    #[serde(default, deserialize_with = "null_as_default")]
    pub svcconfig: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub accept_content_types: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub content_type: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub qps: f64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub burst: i32,
}

impl ClientConnectionConfiguration {
    /// Kubernetes' `RecommendedDefaultClientConnectionConfiguration` with the given rates
    /// (components override the generic 50/100).
    pub fn apply_defaults(&mut self, qps: f64, burst: i32) {
        if self.content_type.is_empty() {
            self.content_type = PROTOBUF_CONTENT_TYPE.into();
        }
        if self.qps == 0.0 {
            self.qps = qps;
        }
        if self.burst == 0 {
            self.burst = burst;
        }
    }

    /// component-base's `ValidateClientConnectionConfiguration`, plus a finite, non-negative
    /// `qps`.
    pub fn validate(&self, path: &Path, errors: &mut ErrorList) {
        if self.burst < 0 {
            invalid(
                errors,
                &path.child("burst"),
                self.burst,
                "must be non-negative",
            );
        }
        if !self.qps.is_finite() || self.qps < 0.0 {
            invalid(errors, &path.child("qps"), self.qps, "must be non-negative");
        }
    }
}

/// Leader election of a replicated component.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElectionConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_elect: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_period: Option<Duration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_lock: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_namespace: String,
}

impl LeaderElectionConfiguration {
    /// Kubernetes' `RecommendedDefaultLeaderElectionConfiguration`: elect, 15 s lease, 10 s
    /// renew deadline, 2 s retry, `leases` lock.
    pub fn apply_defaults(&mut self) {
        self.leader_elect.get_or_insert(true);
        self.lease_duration.get_or_insert(Duration::from_secs(15));
        self.renew_deadline.get_or_insert(Duration::from_secs(10));
        self.retry_period.get_or_insert(Duration::from_secs(2));
        if self.resource_lock.is_empty() {
            self.resource_lock = "leases".into();
        }
    }

    /// component-base's `ValidateLeaderElectionConfiguration` on defaulted values, except that
    /// the spec allows `renewDeadline` equal to `leaseDuration` (Kubernetes wants it lower).
    pub fn validate(&self, path: &Path, errors: &mut ErrorList) {
        if self.leader_elect != Some(true) {
            return;
        }
        let zero = Duration::default();
        for (name, value) in [
            ("leaseDuration", self.lease_duration),
            ("renewDeadline", self.renew_deadline),
            ("retryPeriod", self.retry_period),
        ] {
            let value = value.unwrap_or(zero);
            if value <= zero {
                errors.invalid(
                    path.child(name).as_str(),
                    &value.to_string(),
                    "must be greater than zero",
                );
            }
        }
        let lease = self.lease_duration.unwrap_or(zero);
        let renew = self.renew_deadline.unwrap_or(zero);
        if renew > lease {
            errors.invalid(
                path.child("renewDeadline").as_str(),
                &renew.to_string(),
                "must be less than or equal to leaseDuration",
            );
        }
        for (name, value) in [
            ("resourceLock", &self.resource_lock),
            ("resourceNamespace", &self.resource_namespace),
            ("resourceName", &self.resource_name),
        ] {
            if value.is_empty() {
                errors.required(path.child(name).as_str(), &format!("{name} is required"));
            }
        }
    }
}

/// Profiling switches of a component.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DebuggingConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_profiling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_contention_profiling: Option<bool>,
}

/// A resource quantity written as a string (`"0"`, `"5Mi"`) or a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

impl Default for Quantity {
    fn default() -> Self {
        Self("0".into())
    }
}

impl Quantity {
    /// Its numeric value with the suffix ignored, or `None` when it is not a quantity.
    fn number(&self) -> Option<f64> {
        let s = self.0.as_str();
        let suffixes = [
            "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
        ];
        let body = suffixes.iter().find_map(|x| s.strip_suffix(x)).unwrap_or(s);
        let ok = !body.is_empty()
            && body
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'+' | b'-' | b'e' | b'E'));
        if !ok {
            return None;
        }
        body.parse::<f64>().ok().filter(|v| v.is_finite())
    }

    pub fn is_zero(&self) -> bool {
        self.number() == Some(0.0)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(Self(s)),
            serde_json::Value::Number(n) => Ok(Self(n.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "quantities must be a string or a number, not {other}"
            ))),
        }
    }
}

/// A duration written either as a Go duration string or as integer nanoseconds; it is
/// printed back the way it was written (Kubernetes' `TimeOrMetaDuration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeOrMetaDuration {
    pub duration: Duration,
    pub serialize_as_string: bool,
}

impl Serialize for TimeOrMetaDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.serialize_as_string {
            self.duration.serialize(s)
        } else {
            s.serialize_i64(self.duration.nanos())
        }
    }
}

impl<'de> Deserialize<'de> for TimeOrMetaDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(Self {
                duration: Duration::parse(&s).map_err(serde::de::Error::custom)?,
                serialize_as_string: true,
            }),
            serde_json::Value::Number(n) => Ok(Self {
                duration: Duration(n.as_i64().ok_or_else(|| {
                    serde::de::Error::custom("duration in nanoseconds must be an integer")
                })?),
                serialize_as_string: false,
            }),
            other => Err(serde::de::Error::custom(format!(
                "a duration must be a string or integer nanoseconds, not {other}"
            ))),
        }
    }
}

/// Where one log format sends its output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputRoutingOptions {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub split_stream: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub info_buffer_size: Quantity,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FormatOptions {
    #[serde(default, deserialize_with = "null_as_default")]
    pub text: OutputRoutingOptions,
    #[serde(default, deserialize_with = "null_as_default")]
    pub json: OutputRoutingOptions,
}

/// One `vmodule` item: a file pattern and its verbosity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VModuleItem {
    #[serde(default, deserialize_with = "null_as_default")]
    pub file_pattern: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub verbosity: u32,
}

/// component-base's `LoggingConfiguration`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggingConfiguration {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_frequency: Option<TimeOrMetaDuration>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub verbosity: u32,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub vmodule: Vec<VModuleItem>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub options: FormatOptions,
}

/// Feature gate of the alpha logging options (text output routing, buffer sizes).
pub const LOGGING_ALPHA_OPTIONS: &str = "LoggingAlphaOptions";
/// Feature gate of the beta logging options (JSON output routing); on by default.
pub const LOGGING_BETA_OPTIONS: &str = "LoggingBetaOptions";

impl LoggingConfiguration {
    /// `SetRecommendedLoggingConfiguration`: text format, flush every 5 s.
    pub fn apply_defaults(&mut self) {
        if self.format.is_empty() {
            self.format = "text".into();
        }
        let unset = self
            .flush_frequency
            .is_none_or(|f| f.duration.is_zero() && !f.serialize_as_string);
        if unset {
            self.flush_frequency = Some(TimeOrMetaDuration {
                duration: Duration::from_secs(5),
                serialize_as_string: true,
            });
        }
    }

    /// component-base's `logs/api/v1.Validate`, with the gates of `feature_gates`.
    pub fn validate(
        &self,
        feature_gates: &BTreeMap<String, bool>,
        path: &Path,
        errors: &mut ErrorList,
    ) {
        if !matches!(self.format.as_str(), "" | "text" | "json") {
            errors.invalid(
                path.child("format").as_str(),
                &self.format,
                "Unsupported log format",
            );
        }
        let max = i32::MAX as u32;
        if self.verbosity > max {
            invalid(
                errors,
                &path.child("verbosity"),
                self.verbosity,
                &format!("Must be <= {max}"),
            );
        }
        let vmodule = path.child("vmodule");
        if !self.vmodule.is_empty() && !matches!(self.format.as_str(), "" | "text") {
            errors.forbidden(vmodule.as_str(), "Only supported for text log format");
        }
        for (i, item) in self.vmodule.iter().enumerate() {
            let p = vmodule.index(i);
            if item.file_pattern.is_empty() {
                errors.required(p.as_str(), "File pattern must not be empty");
            }
            if item.file_pattern.contains(['=', ',']) {
                errors.invalid(
                    p.as_str(),
                    &item.file_pattern,
                    "File pattern must not contain equal sign or comma",
                );
            }
            if item.verbosity > max {
                invalid(errors, &p, item.verbosity, &format!("Must be <= {max}"));
            }
        }
        let options = path.child("options");
        let gate = |name: &str, default: bool| feature_gates.get(name).copied().unwrap_or(default);
        for (name, routing, gate_name, on) in [
            (
                "text",
                &self.options.text,
                LOGGING_ALPHA_OPTIONS,
                gate(LOGGING_ALPHA_OPTIONS, false),
            ),
            (
                "json",
                &self.options.json,
                LOGGING_BETA_OPTIONS,
                gate(LOGGING_BETA_OPTIONS, true),
            ),
        ] {
            let p = options.child(name);
            if routing.split_stream && !on {
                errors.forbidden(
                    p.child("splitStream").as_str(),
                    &format!("Feature {gate_name} is disabled"),
                );
            }
            let size = p.child("infoBufferSize");
            match routing.info_buffer_size.number() {
                None => errors.invalid(
                    size.as_str(),
                    &routing.info_buffer_size.0,
                    "quantities must match the regular expression \
                     '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                ),
                Some(v) if v < 0.0 => errors.invalid(
                    size.as_str(),
                    &routing.info_buffer_size.0,
                    "must be greater than or equal to 0",
                ),
                Some(v) if v != 0.0 && !on => {
                    errors.forbidden(size.as_str(), &format!("Feature {gate_name} is disabled"))
                }
                Some(_) => {}
            }
        }
    }
}

/// A value as Kubernetes writes it in an `Invalid value` error: numbers bare, strings and
/// durations quoted.
pub trait FieldValue {
    fn render(&self) -> String;
}

macro_rules! bare_field_values {
    ($($t:ty),*) => {$(
        impl FieldValue for $t {
            fn render(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
bare_field_values!(i32, i64, u32, usize, f64, bool);

impl FieldValue for str {
    fn render(&self) -> String {
        format!("{self:?}")
    }
}

impl FieldValue for String {
    fn render(&self) -> String {
        self.as_str().render()
    }
}

impl FieldValue for Duration {
    fn render(&self) -> String {
        self.to_string().render()
    }
}

impl<T: FieldValue + ?Sized> FieldValue for &T {
    fn render(&self) -> String {
        (**self).render()
    }
}

/// An `Invalid value` error at `path`.
pub fn invalid(errors: &mut ErrorList, path: &Path, value: impl FieldValue, detail: &str) {
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    };
    errors.push(
        path.as_str(),
        "FieldValueInvalid",
        format!("Invalid value: {}{detail}", value.render()),
    );
}

/// A duration that must be set and greater than zero once defaulted.
pub fn positive(errors: &mut ErrorList, path: &Path, value: Option<Duration>) {
    let value = value.unwrap_or_default();
    if value <= Duration::default() {
        invalid(errors, path, value, "must be greater than 0");
    }
}

/// A duration that may be zero but not negative.
pub fn non_negative(errors: &mut ErrorList, path: &Path, value: Option<Duration>) {
    if let Some(v) = value.filter(|v| v.is_negative()) {
        invalid(errors, path, v, "must be greater than or equal to 0");
    }
}

/// Parses `a.b.c.d/n` or `x::/n` (Go's `ParseCIDR`): the address and its prefix length.
pub fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (ip, bits) = text.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    if bits.is_empty() || bits.len() > 3 || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let bits: u8 = bits.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((ip, bits))
}

/// Checks `host:port` as kube-proxy does for its bind addresses: an IP address (IPv6 in
/// brackets) and a port from 1 to 65535.
pub fn validate_host_port(errors: &mut ErrorList, path: &Path, text: &str) {
    let Some((host, port)) = text.rsplit_once(':') else {
        invalid(errors, path, text, "must be IP:port");
        return;
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.parse::<IpAddr>().is_err() {
        invalid(errors, path, host, "must be a valid IP");
    }
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    if !port_ok {
        invalid(errors, path, port, "must be a valid port");
    }
}

/// `errors` with each field path placed under `path` (`args` + `weight` = `args.weight`).
pub fn prefixed(errors: ErrorList, path: &Path) -> ErrorList {
    let mut out = ErrorList::default();
    for mut cause in errors.0 {
        cause.field = if path.as_str().is_empty() {
            cause.field
        } else if cause.field.is_empty() {
            path.to_string()
        } else if cause.field.starts_with('[') {
            format!("{path}{}", cause.field)
        } else {
            format!("{path}.{}", cause.field)
        };
        out.0.push(cause);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_as_go_parses_them() {
        assert_eq!(
            parse_cidr("10.0.0.0/8"),
            Some((IpAddr::from([10, 0, 0, 0]), 8))
        );
        assert!(parse_cidr("fd00::/128").is_some());
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "x/8",
            "/8",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }

    #[test]
    fn host_ports_need_an_ip_and_a_port() {
        let check = |text: &str| {
            let mut e = ErrorList::default();
            validate_host_port(&mut e, &Path::root("addr"), text);
            e.0.len()
        };
        assert_eq!(check("0.0.0.0:10256"), 0);
        assert_eq!(check("[::1]:1"), 0);
        assert_eq!(check("127.0.0.1"), 1);
        assert_eq!(check("localhost:80"), 1);
        assert_eq!(check("1.2.3.4:0"), 1);
        assert_eq!(check("1.2.3.4:65536"), 1);
        assert_eq!(check("nohost:"), 2);
    }

    #[test]
    fn quantities_and_flush_frequencies_keep_how_they_were_written() {
        assert!(Quantity("0".into()).is_zero());
        assert!(Quantity("0Ki".into()).is_zero());
        assert!(!Quantity("5Mi".into()).is_zero());
        assert_eq!(Quantity("lots".into()).number(), None);
        let q: Quantity = serde_json::from_value(serde_json::json!(1024)).unwrap();
        assert_eq!(q.0, "1024");
        let f: TimeOrMetaDuration = serde_json::from_value(serde_json::json!("2s")).unwrap();
        assert_eq!(serde_json::to_value(f).unwrap(), "2s");
        let f: TimeOrMetaDuration = serde_json::from_value(serde_json::json!(5)).unwrap();
        assert_eq!(serde_json::to_value(f).unwrap(), 5);
        assert!(serde_json::from_value::<TimeOrMetaDuration>(serde_json::json!(1.5)).is_err());
    }

    #[test]
    fn field_paths_nest_under_a_prefix() {
        let mut e = ErrorList::default();
        e.required("weight", "");
        e.required("[0].name", "");
        e.required("", "");
        let fields: Vec<String> = prefixed(e, &Path::root("args"))
            .0
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["args.weight", "args[0].name", "args"]);
    }
}
