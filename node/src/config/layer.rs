//! One configuration layer (the file, the environment or the flags): the keys it sets, each
//! value already checked against its key. Layers stack key by key: flag > environment > file >
//! default.

use super::ConfigError;
use super::key::{FromValue, Key, Value};
use baton_shared::limits::CONFIG_FILE_BYTES_MAX;
use std::collections::BTreeMap;
use std::path::Path;

/// The keys one layer sets, each with a value that passed its key's checks.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Layer {
    values: BTreeMap<&'static str, Value>,
}

impl Layer {
    /// Reads and checks a TOML config file (at most `CONFIG_FILE_BYTES_MAX` of it).
    pub fn from_file(path: &Path) -> Result<Layer, ConfigError> {
        let shown = path.display().to_string();
        let text = baton_shared::files::read_text_bounded(path, CONFIG_FILE_BYTES_MAX, "CONFIG_FILE_BYTES_MAX")
            .map_err(|reason| ConfigError::Read { path: shown.clone(), reason })?;
        Layer::from_toml(&shown, &text)
    }

    /// Checks TOML text; `shown` names its origin in errors. Unknown keys are refused by name.
    pub fn from_toml(shown: &str, text: &str) -> Result<Layer, ConfigError> {
        let parse = |message: String| ConfigError::Parse { path: shown.to_string(), message };
        let table: toml::Table = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        let mut layer = Layer::default();
        for (name, value) in table {
            let key = Key::find(&name).ok_or_else(|| {
                let known: Vec<&str> = super::KEYS.iter().map(|k| k.name).collect();
                parse(format!("unknown key {name:?} (the keys are {})", known.join(", ")))
            })?;
            layer.values.insert(key.name, key.read_toml(value)?);
        }
        Ok(layer)
    }

    /// Reads the `BATON_NODE_<KEY>` variables through `lookup` (the process environment in
    /// production, a map in tests).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Layer, ConfigError> {
        let mut layer = Layer::default();
        for key in super::KEYS {
            if let Some(text) = lookup(&key.env_var()) {
                layer.values.insert(key.name, key.read_text(&text)?);
            }
        }
        Ok(layer)
    }

    /// Sets one key from its text form, as a flag or an environment variable writes it.
    pub fn set(&mut self, name: &str, text: &str) -> Result<(), ConfigError> {
        let key = Key::find(name).ok_or_else(|| ConfigError::invalid("config", format!("unknown key {name:?}")))?;
        self.values.insert(key.name, key.read_text(text)?);
        Ok(())
    }

    /// This layer with every key that `top` sets taken from `top`.
    pub fn overlaid_with(mut self, top: Layer) -> Layer {
        self.values.extend(top.values);
        self
    }

    /// Takes key `name` out of the layer (or its default) as the type of its field.
    pub(super) fn take<T: FromValue>(&mut self, name: &'static str) -> Result<T, ConfigError> {
        let key = Key::find(name).ok_or_else(|| ConfigError::invalid(name, "is not in the key table"))?;
        let value = match self.values.remove(name) {
            Some(v) => v,
            None => key.default_value()?,
        };
        T::from_value(key.name, value)
    }
}
