//! The admission chain: plugins that see every write after authorization. Mutating plugins
//! run first and may change the object; then the object's own defaulting and validation;
//! then validating plugins, which see the final object; then the store. Both kinds see the
//! old object (updates, deletes) and the request's attributes, and may add warnings and audit
//! annotations. Deletes run validating plugins only, with the old object. Dry-run requests
//! are admitted like others; plugins must not have side effects for them
//! (`Attributes::dry_run`).
//!
//! Plugins are registered by name (`REGISTRY`, in Kubernetes' order); the flags
//! `--enable-admission-plugins` and `--disable-admission-plugins` pick them and
//! `--admission-control-config-file` (an `AdmissionConfiguration`) configures them. With no
//! plugin enabled the chain is empty and a write pays one length check per phase. The
//! webhook plugins (`admission/webhook.rs`), on by default as in Kubernetes, get their parts
//! from [`Chain::with_webhooks`] once the server's caches exist; with no webhook configured
//! they cost one pointer comparison per phase.

pub mod event_rate_limit;
pub mod webhook;

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use svc_config::ConfigError;
use svc_config::admission::{AdmissionConfiguration, PluginSource};
use svc_core::object;
use svc_core::resource::ResourceInfo;
use svc_core::user::UserInfo;
use svc_core::{ApiError, Resource};

use crate::base::flags::Options;

/// What a write does, as admission names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    /// As an `AdmissionRequest` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// The request a plugin is asked about.
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    pub operation: Operation,
    /// The resource written to (group, version, resource). The object is of its kind, except
    /// through a subresource that takes another (`serviceaccounts/token` takes a
    /// TokenRequest): plugins downcast the object to the type they expect.
    pub info: &'static ResourceInfo,
    pub subresource: Option<&'a str>,
    pub namespace: &'a str,
    /// Empty on a create whose name is still to be generated.
    pub name: &'a str,
    pub user: &'a UserInfo,
    /// Nothing will be stored: a plugin must not have side effects (charge a quota, call a
    /// webhook without side effects declared `None`/`NoneOnDryRun`, ...).
    pub dry_run: bool,
    /// The request's audit annotations (None when it is not audited): the chain copies the
    /// plugins' `Outcome::audit_annotations` there, whether they admitted or refused.
    pub audit: Option<&'a crate::base::annotations::Annotations>,
}

/// Copies what plugins annotated so far to the request's audit event.
fn to_audit(attrs: &Attributes<'_>, out: &Outcome) {
    if let Some(audit) = attrs.audit {
        for (k, v) in &out.audit_annotations {
            audit.add(k, v);
        }
    }
}

/// An object as plugins see it: the typed value (downcast to the kind a plugin knows) and
/// its JSON form on demand.
pub trait AdmissionObject: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn to_json(&self) -> Result<Value, ApiError>;
}

impl<T: Resource> AdmissionObject for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn to_json(&self) -> Result<Value, ApiError> {
        serde_json::to_value(self).map_err(ApiError::internal)
    }
}

/// Kubernetes' bounds on the warnings of one response: each kept to 256 characters once
/// the total passes 4096, and none added past twice that.
const WARNING_ITEM_CHARS: usize = 256;
const WARNINGS_TOTAL_CHARS: usize = 4096;
/// Audit annotations one request may collect.
const MAX_AUDIT_ANNOTATIONS: usize = 256;

/// What plugins add to a request besides their verdict: warnings for the client and
/// annotations for the audit log. Both are bounded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    warning_chars: usize,
}

impl Outcome {
    /// Adds a warning for the client (`Warning: 299` header); duplicates and empty ones are
    /// dropped, and past the total bound long ones are truncated and then dropped.
    pub fn warn(&mut self, text: impl Into<String>) {
        let mut text: String = text.into();
        if text.trim().is_empty() || self.warnings.contains(&text) {
            return;
        }
        let chars = text.chars().count();
        if self.warning_chars.saturating_add(chars) > WARNINGS_TOTAL_CHARS
            && chars > WARNING_ITEM_CHARS
        {
            text = text.chars().take(WARNING_ITEM_CHARS).collect();
        }
        let chars = text.chars().count();
        if self.warning_chars.saturating_add(chars) > 2 * WARNINGS_TOTAL_CHARS {
            return;
        }
        self.warning_chars = self.warning_chars.saturating_add(chars);
        self.warnings.push(text);
    }

    /// Records an audit annotation `key` (the caller prefixes it with its plugin's name);
    /// the first value given for a key stays, as in Kubernetes.
    pub fn annotate(&mut self, key: impl Into<String>, value: impl Into<String>) {
        if self.audit_annotations.len() < MAX_AUDIT_ANNOTATIONS {
            self.audit_annotations
                .entry(key.into())
                .or_insert_with(|| value.into());
        }
    }
}

/// A plugin that may change the object before it is validated.
#[async_trait]
pub trait Mutating: Send + Sync {
    /// Whether the plugin has anything to do for this request (cheap: called on every write).
    fn handles(&self, attrs: &Attributes<'_>) -> bool;
    /// Admits (and may change) `object`, the JSON form of what will be stored; `old` is the
    /// stored object for updates. Returns whether `object` changed.
    async fn admit(
        &self,
        attrs: &Attributes<'_>,
        object: &mut Value,
        old: Option<&dyn AdmissionObject>,
        out: &mut Outcome,
    ) -> Result<bool, ApiError>;
}

/// A plugin that accepts or refuses the final object.
#[async_trait]
pub trait Validating: Send + Sync {
    fn handles(&self, attrs: &Attributes<'_>) -> bool;
    /// `object` is what will be stored (none on delete); `old` the stored object for updates
    /// and deletes.
    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        object: Option<&dyn AdmissionObject>,
        old: Option<&dyn AdmissionObject>,
        out: &mut Outcome,
    ) -> Result<(), ApiError>;
}

/// One plugin's parts: a plugin may mutate, validate, or both.
#[derive(Clone, Default)]
pub struct Plugin {
    pub mutating: Option<Arc<dyn Mutating>>,
    pub validating: Option<Arc<dyn Validating>>,
}

/// A plugin the server knows by name.
pub struct Registration {
    pub name: &'static str,
    /// On unless `--disable-admission-plugins` names it.
    pub enabled_by_default: bool,
    /// Builds the plugin from its configuration document (from the AdmissionConfiguration),
    /// if one was given.
    pub build: fn(Option<Value>) -> Result<Plugin, String>,
}

/// Every plugin, in the order they run (Kubernetes' recommended order).
pub const REGISTRY: &[Registration] = &[
    Registration {
        name: event_rate_limit::NAME,
        enabled_by_default: false,
        build: event_rate_limit::build,
    },
    Registration {
        name: webhook::MUTATING_NAME,
        enabled_by_default: true,
        build: webhook::build,
    },
    Registration {
        name: webhook::VALIDATING_NAME,
        enabled_by_default: true,
        build: webhook::build,
    },
];

/// The enabled plugins, each phase in registry order.
#[derive(Clone, Default)]
pub struct Chain {
    names: Vec<&'static str>,
    mutating: Vec<Arc<dyn Mutating>>,
    validating: Vec<Arc<dyn Validating>>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("plugins", &self.names)
            .finish()
    }
}

impl Chain {
    /// A chain of the given plugins, in this order.
    pub fn new(plugins: Vec<(&'static str, Plugin)>) -> Self {
        let mut chain = Chain::default();
        for (name, p) in plugins {
            chain.names.push(name);
            chain.mutating.extend(p.mutating);
            chain.validating.extend(p.validating);
        }
        chain
    }

    /// The chain the flags ask for: the default plugins plus `--enable-admission-plugins`
    /// minus `--disable-admission-plugins`, configured from `--admission-control-config-file`.
    pub fn from_options(opts: &Options) -> Result<Self, String> {
        let names = enabled_plugins(
            &opts.enable_admission_plugins,
            &opts.disable_admission_plugins,
        )?;
        let file = match &opts.admission_control_config_file {
            Some(path) => Some((path.as_path(), read_admission_configuration(path)?)),
            None => None,
        };
        let mut plugins = Vec::new();
        for reg in REGISTRY.iter().filter(|r| names.contains(&r.name)) {
            let (config, source) = match &file {
                Some((path, cfg)) => match plugin_configuration(path, cfg, reg.name)? {
                    Some((config, source)) => (Some(config), format!("{source}: ")),
                    None => (None, String::new()),
                },
                None => (None, String::new()),
            };
            let plugin = (reg.build)(config)
                .map_err(|e| format!("admission plugin {}: {source}{e}", reg.name))?;
            plugins.push((reg.name, plugin));
        }
        if let Some((path, cfg)) = &file {
            for p in &cfg.plugins {
                if !plugins.iter().any(|(n, _)| *n == p.name) {
                    tracing::warn!(plugin = %p.name, file = %path.display(),
                        "configuration given for an admission plugin that is not enabled");
                }
            }
        }
        Ok(Chain::new(plugins))
    }

    /// Attaches the webhook plugins' parts, where the flags enabled them. They run last in
    /// their phases, as they come last in the registry.
    pub fn with_webhooks(mut self, webhooks: Arc<webhook::Webhooks>) -> Self {
        let (mutating, validating) = webhooks.plugins();
        if self.names.contains(&webhook::MUTATING_NAME) {
            self.mutating.push(mutating);
        }
        if self.names.contains(&webhook::VALIDATING_NAME) {
            self.validating.push(validating);
        }
        self
    }

    /// The enabled plugins' names, in order.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Runs the mutating plugins that handle `attrs` over `obj` (`old`: the stored object
    /// of an update). The object is converted to JSON only when some plugin handles the
    /// request, and decoded back only when one changed it.
    pub async fn mutate<T: Resource>(
        &self,
        attrs: &Attributes<'_>,
        obj: &mut T,
        old: Option<&T>,
        out: &mut Outcome,
    ) -> Result<(), ApiError> {
        if self.mutating.is_empty() {
            return Ok(());
        }
        let mut json: Option<Value> = None;
        let mut changed = false;
        for plugin in self.mutating.iter().filter(|p| p.handles(attrs)) {
            let value = match &mut json {
                Some(v) => v,
                None => json.insert(obj.to_json()?),
            };
            let old = old.map(|o| o as &dyn AdmissionObject);
            let admitted = plugin.admit(attrs, value, old, out).await;
            to_audit(attrs, out);
            changed |= admitted?;
        }
        if let (true, Some(value)) = (changed, json) {
            let mut next: T = serde_json::from_value(value).map_err(|e| {
                ApiError::internal(format!(
                    "admission changed the {} into something that does not decode: {e}",
                    T::INFO.kind
                ))
            })?;
            object::check_type_meta(&next)?;
            next.set_type_meta();
            *obj = next;
        }
        Ok(())
    }

    /// Runs the validating plugins that handle `attrs`: `obj` is what will be stored (none
    /// on delete), `old` the stored object of an update or delete. The first refusal ends it.
    pub async fn validate<T: Resource>(
        &self,
        attrs: &Attributes<'_>,
        obj: Option<&T>,
        old: Option<&T>,
        out: &mut Outcome,
    ) -> Result<(), ApiError> {
        if self.validating.is_empty() {
            return Ok(());
        }
        for plugin in self.validating.iter().filter(|p| p.handles(attrs)) {
            let obj = obj.map(|o| o as &dyn AdmissionObject);
            let old = old.map(|o| o as &dyn AdmissionObject);
            let validated = plugin.validate(attrs, obj, old, out).await;
            to_audit(attrs, out);
            validated?;
        }
        Ok(())
    }
}

/// The plugins to run, by name, checked as Kubernetes checks its flags: every name known, and
/// no name both enabled and disabled.
pub fn enabled_plugins(enable: &[String], disable: &[String]) -> Result<Vec<&'static str>, String> {
    let known = |n: &str| REGISTRY.iter().any(|r| r.name == n);
    let mut errors = Vec::new();
    for (flag, names) in [
        ("enable-admission-plugins", enable),
        ("disable-admission-plugins", disable),
    ] {
        for n in names.iter().filter(|n| !n.is_empty() && !known(n)) {
            errors.push(format!(
                "--{flag}: unknown admission plugin {n:?} (known: {})",
                REGISTRY
                    .iter()
                    .map(|r| r.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let both: Vec<&str> = enable
        .iter()
        .filter(|n| !n.is_empty() && disable.contains(n))
        .map(String::as_str)
        .collect();
    if !both.is_empty() {
        errors.push(format!(
            "{both:?} in both --enable-admission-plugins and --disable-admission-plugins"
        ));
    }
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(REGISTRY
        .iter()
        .filter(|r| {
            (r.enabled_by_default || enable.iter().any(|n| n == r.name))
                && !disable.iter().any(|n| n == r.name)
        })
        .map(|r| r.name)
        .collect())
}

fn read_admission_configuration(path: &Path) -> Result<AdmissionConfiguration, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("--admission-control-config-file {}: {e}", path.display()))?;
    svc_config::load::<AdmissionConfiguration>(&bytes).map_err(|e| in_file(path, e))
}

/// Plugin `name`'s configuration document from the AdmissionConfiguration at `path`, and
/// where it was found (for errors): inline, or read from its own file (relative to `path`'s
/// directory).
fn plugin_configuration(
    path: &Path,
    cfg: &AdmissionConfiguration,
    name: &str,
) -> Result<Option<(Value, String)>, String> {
    match cfg.plugin(name) {
        None => Ok(None),
        Some(PluginSource::Inline(v)) => Ok(Some((v.clone(), path.display().to_string()))),
        Some(PluginSource::File(file)) => {
            let file = Path::new(file);
            let resolved = if file.is_absolute() {
                file.to_path_buf()
            } else {
                path.parent().unwrap_or(Path::new(".")).join(file)
            };
            let bytes = std::fs::read(&resolved)
                .map_err(|e| format!("admission plugin {name}: {}: {e}", resolved.display()))?;
            svc_config::parse_document(&bytes)
                .map(|v| Some((v, resolved.display().to_string())))
                .map_err(|e| format!("admission plugin {name}: {}", in_file(&resolved, e)))
        }
    }
}

fn in_file(path: &Path, e: ConfigError) -> String {
    format!("{}: {e}", path.display())
}

#[cfg(test)]
mod tests;
