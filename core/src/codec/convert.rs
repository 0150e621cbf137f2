//! Conversions between the object model's metadata types and their protobuf messages.
//!
//! Encoding is infallible; decoding fails only on values the model cannot hold (a time outside
//! the representable range, `fieldsV1` that is not JSON), and always as a 400.

use time::OffsetDateTime;

use super::wire;
use crate::meta::{ListMeta, ManagedFieldsEntry, MicroTime, ObjectMeta, OwnerReference, Time};
use crate::status::{ApiError, Status, StatusCause, StatusDetails};

/// Kubernetes' `Time` carries whole seconds on the wire (its `ProtoTime` leaves `nanos` unset
/// so protobuf and JSON clients see the same value), which is also our `Time`'s precision.
pub(crate) fn time_to_wire(t: &Time) -> wire::Time {
    wire::Time {
        seconds: Some(t.unix()),
        nanos: None,
    }
}

/// `None` for an absent or empty message: that is how Go writes a zero `metav1.Time`, which is
/// what a Go client sends for a `creationTimestamp` it never set.
pub(crate) fn time_from_wire(t: Option<&wire::Time>) -> Result<Option<Time>, ApiError> {
    let Some(t) = t else { return Ok(None) };
    if t.seconds.is_none() && t.nanos.is_none() {
        return Ok(None);
    }
    // Like Kubernetes' `Time.Unmarshal`, sub-second `nanos` are dropped.
    let seconds = t.seconds.unwrap_or(0);
    OffsetDateTime::from_unix_timestamp(seconds)
        .map(|t| Some(Time(t)))
        .map_err(|e| ApiError::bad_request(format!("invalid protobuf time {seconds}s: {e}")))
}

/// Kubernetes' `MicroTime` travels as a `Timestamp` with both fields written and `nanos`
/// truncated to microseconds (`ProtoMicroTime`); a zero value is an empty message.
pub(crate) fn micro_time_to_wire(t: &MicroTime) -> wire::Time {
    let (seconds, nanos) = t.unix();
    wire::Time {
        seconds: Some(seconds),
        nanos: Some((nanos / 1_000).saturating_mul(1_000)),
    }
}

/// `None` for an absent or empty message (Go's zero `MicroTime`); `nanos` are truncated to
/// microseconds, as Kubernetes' `MicroTime.Unmarshal` does.
pub(crate) fn micro_time_from_wire(t: Option<&wire::Time>) -> Result<Option<MicroTime>, ApiError> {
    let Some(t) = t else { return Ok(None) };
    if t.seconds.is_none() && t.nanos.is_none() {
        return Ok(None);
    }
    let (seconds, nanos) = (t.seconds.unwrap_or(0), t.nanos.unwrap_or(0));
    let nanos = u32::try_from(nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| ApiError::bad_request(format!("invalid protobuf time nanos {nanos}")))?;
    OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|t| t.replace_nanosecond(nanos).ok())
        .map(|t| Some(MicroTime::new(t)))
        .ok_or_else(|| ApiError::bad_request(format!("invalid protobuf time {seconds}s")))
}

pub(crate) fn object_meta_to_wire(m: &ObjectMeta) -> wire::ObjectMeta {
    wire::ObjectMeta {
        name: m.name.clone(),
        generate_name: m.generate_name.clone(),
        namespace: m.namespace.clone(),
        self_link: m.self_link.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        generation: m.generation.unwrap_or(0),
        creation_timestamp: m.creation_timestamp.as_ref().map(time_to_wire),
        deletion_timestamp: m.deletion_timestamp.as_ref().map(time_to_wire),
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        owner_references: m.owner_references.iter().map(owner_to_wire).collect(),
        finalizers: m.finalizers.clone(),
        managed_fields: m.managed_fields.iter().map(managed_to_wire).collect(),
    }
}

pub(crate) fn object_meta_from_wire(m: wire::ObjectMeta) -> Result<ObjectMeta, ApiError> {
    Ok(ObjectMeta {
        creation_timestamp: time_from_wire(m.creation_timestamp.as_ref())?,
        deletion_timestamp: time_from_wire(m.deletion_timestamp.as_ref())?,
        managed_fields: m
            .managed_fields
            .into_iter()
            .map(managed_from_wire)
            .collect::<Result<_, _>>()?,
        name: m.name,
        generate_name: m.generate_name,
        namespace: m.namespace,
        self_link: m.self_link,
        uid: m.uid,
        resource_version: m.resource_version,
        // Go's `Generation` is a plain int64 that Go clients always send; 0 means unset, as it
        // does in JSON where Kubernetes omits it.
        generation: (m.generation != 0).then_some(m.generation),
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m
            .owner_references
            .into_iter()
            .map(owner_from_wire)
            .collect(),
        finalizers: m.finalizers,
    })
}

fn owner_to_wire(o: &OwnerReference) -> wire::OwnerReference {
    wire::OwnerReference {
        kind: o.kind.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
        api_version: o.api_version.clone(),
        controller: o.controller,
        block_owner_deletion: o.block_owner_deletion,
    }
}

fn owner_from_wire(o: wire::OwnerReference) -> OwnerReference {
    OwnerReference {
        api_version: o.api_version,
        kind: o.kind,
        name: o.name,
        uid: o.uid,
        controller: o.controller,
        block_owner_deletion: o.block_owner_deletion,
    }
}

fn managed_to_wire(e: &ManagedFieldsEntry) -> wire::ManagedFieldsEntry {
    wire::ManagedFieldsEntry {
        manager: e.manager.clone(),
        operation: e.operation.clone(),
        api_version: e.api_version.clone(),
        time: e.time.as_ref().map(time_to_wire),
        fields_type: e.fields_type.clone(),
        // FieldsV1.Raw is the JSON form of the trie, byte for byte what JSON clients see.
        fields_v1: e.fields_v1.as_ref().map(|v| wire::FieldsV1 {
            raw: serde_json::to_vec(v).unwrap_or_default(),
        }),
        subresource: e.subresource.clone(),
    }
}

fn managed_from_wire(e: wire::ManagedFieldsEntry) -> Result<ManagedFieldsEntry, ApiError> {
    let fields_v1 = match e.fields_v1 {
        None => None,
        Some(f) => Some(serde_json::from_slice(&f.raw).map_err(|err| {
            ApiError::bad_request(format!("invalid managedFields fieldsV1 (not JSON): {err}"))
        })?),
    };
    Ok(ManagedFieldsEntry {
        manager: e.manager,
        operation: e.operation,
        api_version: e.api_version,
        time: time_from_wire(e.time.as_ref())?,
        fields_type: e.fields_type,
        fields_v1,
        subresource: e.subresource,
    })
}

pub(crate) fn list_meta_to_wire(m: &ListMeta) -> wire::ListMeta {
    wire::ListMeta {
        self_link: m.self_link.clone(),
        resource_version: m.resource_version.clone(),
        continue_: m.continue_.clone(),
        remaining_item_count: m.remaining_item_count,
    }
}

pub(crate) fn list_meta_from_wire(m: wire::ListMeta) -> ListMeta {
    ListMeta {
        self_link: m.self_link,
        resource_version: m.resource_version,
        continue_: m.continue_,
        remaining_item_count: m.remaining_item_count,
    }
}

pub(crate) fn status_to_wire(s: &Status) -> wire::Status {
    wire::Status {
        // Go's Status.ListMeta is a value, so Go always writes it; so do we.
        metadata: Some(list_meta_to_wire(&s.metadata)),
        status: s.status.clone(),
        message: s.message.clone(),
        reason: s.reason.clone(),
        details: s.details.as_ref().map(|d| wire::StatusDetails {
            name: d.name.clone(),
            group: d.group.clone(),
            kind: d.kind.clone(),
            causes: d
                .causes
                .iter()
                .map(|c| wire::StatusCause {
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    field: c.field.clone(),
                })
                .collect(),
            retry_after_seconds: d.retry_after_seconds.unwrap_or(0),
            uid: d.uid.clone(),
        }),
        code: i32::from(s.code),
    }
}

/// `kind`/`apiVersion` are not in the message; the caller takes them from the envelope.
pub(crate) fn status_from_wire(s: wire::Status) -> Status {
    Status {
        kind: String::new(),
        api_version: String::new(),
        metadata: s.metadata.map(list_meta_from_wire).unwrap_or_default(),
        status: s.status,
        message: s.message,
        reason: s.reason,
        details: s.details.map(|d| StatusDetails {
            name: d.name,
            group: d.group,
            kind: d.kind,
            uid: d.uid,
            causes: d
                .causes
                .into_iter()
                .map(|c| StatusCause {
                    reason: c.reason,
                    message: c.message,
                    field: c.field,
                })
                .collect(),
            retry_after_seconds: (d.retry_after_seconds != 0).then_some(d.retry_after_seconds),
        }),
        // HTTP codes fit u16; anything else is a broken peer, and 0 is Go's "not set".
        code: u16::try_from(s.code).unwrap_or(0),
    }
}
