//! `[[models]]`: several served models, each with its own tokenizer,
//! template, parsers, adapters and backends. The single `[model]` table
//! with top-level `[[backends]]` is the one-model form of the same thing.
//!
//! After loading, the top-level `model` and `backends` are the first
//! model's (what a request naming no model is served by), and
//! [`Config::served`] gives one view per model: the config with that
//! model's table and backends in place of the first's.

use serde::Deserialize;

use super::{backend, invalid, BackendConfig, BackendKind, Config, ConfigError, ModelConfig};

/// One entry of `[[models]] backends`: a `[[models.backends]]` table, or the
/// name of one of the top-level `[[backends]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a [[models.backends]] table (url, kind, ...) or the name of one of the [[backends]]"
)]
pub enum BackendRef {
    Named(String),
    Inline(BackendConfig),
}

/// Which form a config serves its models in (`tito check-config` says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelsForm {
    /// `[model]` with top-level `[[backends]]`.
    Single,
    /// `[[models]]`, each with its own backends.
    List,
}

impl ModelsForm {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelsForm::Single => "[model]",
            ModelsForm::List => "[[models]]",
        }
    }
}

/// Turns `[[models]]` into resolved models: each model's `backends` become
/// inline tables (a name is replaced by the `[[backends]]` entry it names),
/// and the top-level `model` / `backends` become the first model's. A
/// config with `[model]` (`has_model_table`) is left as it is.
pub(super) fn resolve(config: &mut Config, has_model_table: bool) -> Result<(), ConfigError> {
    if config.models.is_empty() {
        if let Some(first) = config.model.backends.first() {
            return Err(invalid(
                "model.backends",
                describe(first),
                "with a [model] table the backends are the top-level [[backends]]; \
                 per-model backends belong to [[models]] entries",
            ));
        }
        return Ok(());
    }
    if has_model_table {
        return Err(invalid(
            "model",
            &config.model.name,
            "a config serves either one [model] table or a [[models]] list, not both",
        ));
    }
    let pool = std::mem::take(&mut config.backends);
    let mut used = vec![None::<usize>; pool.len()];
    for (m, model) in config.models.iter_mut().enumerate() {
        if model.backends.is_empty() {
            return Err(invalid(
                &format!("models[{m}].backends"),
                &model.name,
                "a model needs at least one backend: [[models.backends]] tables or names of \
                 [[backends]] entries",
            ));
        }
        let mut resolved = Vec::with_capacity(model.backends.len());
        for (b, r) in model.backends.iter().enumerate() {
            let key = format!("models[{m}].backends[{b}]");
            let cfg = match r {
                BackendRef::Inline(c) => c.clone(),
                BackendRef::Named(name) => {
                    let Some(i) = pool.iter().position(|p| p.display_name() == *name) else {
                        return Err(invalid(
                            &key,
                            name,
                            "names no [[backends]] entry (by name, else url)",
                        ));
                    };
                    if let Some(other) = used[i] {
                        return Err(invalid(
                            &key,
                            name,
                            &format!(
                                "is already a backend of models[{other}]: one backend serves \
                                 one model"
                            ),
                        ));
                    }
                    used[i] = Some(m);
                    pool[i].clone()
                }
            };
            resolved.push(BackendRef::Inline(cfg));
        }
        model.backends = resolved;
    }
    if let Some(i) = used.iter().position(Option::is_none) {
        return Err(invalid(
            &format!("backends[{i}]"),
            pool[i].display_name(),
            "is named by no [[models]] entry: with [[models]], each [[backends]] entry serves \
             the model that names it",
        ));
    }
    config.model = config.models[0].clone();
    config.model.backends = Vec::new();
    config.backends = inline(&config.models[0]);
    Ok(())
}

fn describe(r: &BackendRef) -> String {
    match r {
        BackendRef::Named(n) => n.clone(),
        BackendRef::Inline(c) => c.display_name(),
    }
}

/// A resolved model's backends.
fn inline(model: &ModelConfig) -> Vec<BackendConfig> {
    model
        .backends
        .iter()
        .filter_map(|r| match r {
            BackendRef::Inline(c) => Some(c.clone()),
            BackendRef::Named(_) => None,
        })
        .collect()
}

/// Renames a model-level error's key to the entry it came from:
/// `model.x` → `models[m].x`, `backends[i]...` → `models[m].backends[i]...`.
fn in_entry(e: ConfigError, m: usize) -> ConfigError {
    match e {
        ConfigError::Invalid { key, value, reason } => {
            let key = match key.strip_prefix("model.") {
                Some(rest) => format!("models[{m}].{rest}"),
                None if key.starts_with("backends") => format!("models[{m}].{key}"),
                None => key,
            };
            ConfigError::Invalid { key, value, reason }
        }
        other => other,
    }
}

impl Config {
    /// Which form this config serves its models in.
    pub fn models_form(&self) -> ModelsForm {
        match self.models.is_empty() {
            true => ModelsForm::Single,
            false => ModelsForm::List,
        }
    }

    /// One config per served model, in order: this config with the model's
    /// table as `model` and its backends as `backends`. The one-model form
    /// gives itself.
    pub fn served(&self) -> Vec<Config> {
        if self.models.is_empty() {
            return vec![self.clone()];
        }
        self.models
            .iter()
            .map(|m| {
                let mut view = self.clone();
                view.backends = inline(m);
                view.model = m.clone();
                view.model.backends = Vec::new();
                view.models = Vec::new();
                if !view
                    .backends
                    .iter()
                    .any(|b| b.display_name() == view.verify.backend)
                {
                    // `verify.backend` is one model's; the others replay
                    // where their router sends.
                    view.verify.backend = String::new();
                }
                view
            })
            .collect()
    }

    /// The `[[models]]` checks: each entry as `[model]` is checked, then
    /// ids and backends across entries.
    pub(super) fn validate_models(&self) -> Result<(), ConfigError> {
        let mut ids = std::collections::HashMap::new();
        let mut engine = None;
        let mut backend_names = std::collections::HashMap::new();
        for (m, model) in self.models.iter().enumerate() {
            model.validate().map_err(|e| in_entry(e, m))?;
            let backends = inline(model);
            backend::validate(&backends).map_err(|e| in_entry(e, m))?;
            let adapters = model.adapters.iter().map(|a| (a.name.as_str(), "adapters"));
            for (id, what) in std::iter::once((model.name.as_str(), "name")).chain(adapters) {
                if let Some(other) = ids.insert(id.to_string(), m) {
                    return Err(invalid(
                        &format!("models[{m}].{what}"),
                        id,
                        &format!(
                            "is already served by models[{other}]: model and adapter ids are \
                             unique across [[models]]"
                        ),
                    ));
                }
            }
            for (b, cfg) in backends.iter().enumerate() {
                if cfg.kind == BackendKind::Engine && cfg.url == "engine" {
                    if let Some(other) = engine.replace(m).filter(|o| *o != m) {
                        return Err(invalid(
                            &format!("models[{m}].backends[{b}].url"),
                            "engine",
                            &format!(
                                "models[{other}] already runs the bundled engine: [engine] \
                                 loads one model per process"
                            ),
                        ));
                    }
                }
                if let Some(other) = backend_names.insert(cfg.display_name(), m) {
                    return Err(invalid(
                        &format!("models[{m}].backends[{b}]"),
                        cfg.display_name(),
                        &format!(
                            "is also a backend of models[{other}]: backend names/urls are \
                             unique across [[models]]"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
