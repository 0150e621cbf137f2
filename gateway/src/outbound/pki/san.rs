//! Subject alternative names: parsing `--tls-san` values and reading them back from
//! certificates, normalized so the two compare.

use std::net::IpAddr;

use rcgen::SanType;
use rcgen::string::Ia5String;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::PkiError;

/// One subject alternative name, normalized so requested and existing names compare.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum SanName {
    Ip(IpAddr),
    Dns(String),
}

impl SanName {
    /// `Ok(None)` for a blank entry (an empty flag value is not an error worth failing on).
    pub(super) fn parse(raw: &str) -> Result<Option<Self>, PkiError> {
        let value = raw.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let unbracketed = value
            .strip_prefix('[')
            .and_then(|v| v.strip_suffix(']'))
            .unwrap_or(value);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            return Ok(Some(Self::Ip(ip)));
        }
        let invalid = |reason| PkiError::InvalidSan {
            value: raw.to_owned(),
            reason,
        };
        let name = value.trim_end_matches('.').to_ascii_lowercase();
        if name.len() > 253 {
            return Err(invalid("longer than 253 characters"));
        }
        for (i, label) in name.split('.').enumerate() {
            if label.is_empty() || label.len() > 63 {
                return Err(invalid("every DNS label must have 1 to 63 characters"));
            }
            if label == "*" && i == 0 {
                continue;
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(
                    "not an IP address, nor a DNS name of [a-z0-9-_] labels",
                ));
            }
        }
        Ok(Some(Self::Dns(name)))
    }

    pub(super) fn to_rcgen(&self) -> Result<SanType, PkiError> {
        match self {
            Self::Ip(ip) => Ok(SanType::IpAddress(*ip)),
            Self::Dns(name) => Ia5String::try_from(name.as_str())
                .map(SanType::DnsName)
                .map_err(|_| PkiError::InvalidSan {
                    value: name.clone(),
                    reason: "not ASCII",
                }),
        }
    }
}

pub(super) fn sans_of(x509: &X509Certificate<'_>) -> Vec<SanName> {
    let Ok(Some(ext)) = x509.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(SanName::Dns(dns.to_ascii_lowercase())),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                _ => None,
            }
            .map(SanName::Ip),
            _ => None,
        })
        .collect()
}
