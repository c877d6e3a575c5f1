//! The figures of one run: an ordered list printed as a table (one figure per line) and
//! written as flat JSON, plus the targets, each marked met or not.

use serde_json::{Map, Value, json};
use std::io::Write;

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Figure {
    /// The JSON key, with the unit in its name.
    pub key: String,
    /// The value; `None` when the step was skipped or could not produce it.
    pub value: Option<f64>,
    /// What it is, for the table.
    pub note: String,
}

/// One target from the issue.
#[derive(Debug, Clone)]
pub struct Target {
    /// What is measured, e.g. `e2e_deliveries_per_s >= 10000`.
    pub name: String,
    /// The measured value, when there is one.
    pub measured: Option<f64>,
    /// measured / target for "at least" targets, target / measured for "at most" ones:
    /// at least 1.0 means met.
    pub margin: Option<f64>,
}

impl Target {
    /// Whether the target is met (`None` when it was not measured).
    pub fn met(&self) -> Option<bool> {
        self.margin.map(|m| m >= 1.0)
    }
}

/// Every figure of a run, in the order measured.
#[derive(Debug, Default)]
pub struct Figures {
    list: Vec<Figure>,
    targets: Vec<Target>,
    context: Map<String, Value>,
}

impl Figures {
    /// Records a figure (replacing an earlier one with the same key).
    pub fn put(&mut self, key: &str, value: Option<f64>, note: &str) {
        let value = value.filter(|v| v.is_finite());
        self.list.retain(|f| f.key != key);
        self.list.push(Figure { key: key.to_string(), value, note: note.to_string() });
    }

    /// A recorded value.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.list.iter().find(|f| f.key == key).and_then(|f| f.value)
    }

    /// Records `key / denominator` as `key_over_denominator` (the ratio to a ceiling).
    pub fn ratio(&mut self, key: &str, denominator: &str) {
        let value = match (self.get(key), self.get(denominator)) {
            (Some(a), Some(b)) if b != 0.0 => Some(a / b),
            _ => None,
        };
        self.put(&format!("{key}_over_{denominator}"), value, &format!("{key} / {denominator}"));
    }

    /// Records a target that `key` must reach at least (`at_least`) or stay under.
    pub fn target(&mut self, name: &str, key: &str, bound: f64, at_least: bool) {
        self.target_value(name, self.get(key), bound, at_least);
    }

    /// Records a target over an already computed `measured` value.
    pub fn target_value(&mut self, name: &str, measured: Option<f64>, bound: f64, at_least: bool) {
        let margin = measured.map(|m| if at_least { m / bound } else { bound / m.max(f64::MIN_POSITIVE) });
        self.targets.push(Target { name: name.to_string(), measured, margin });
    }

    /// Records a fact about the run (machine, parameters) for the JSON `context` object.
    pub fn context(&mut self, key: &str, value: Value) {
        self.context.insert(key.to_string(), value);
    }

    /// Writes the table: context, then one figure per line, then the targets.
    pub fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        for (k, v) in &self.context {
            let v = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            writeln!(out, "# {k}: {v}")?;
        }
        let width = self.list.iter().map(|f| f.key.len()).max().unwrap_or(0);
        for f in &self.list {
            writeln!(out, "{:<width$}  {:>14}  {}", f.key, format_value(f.value), f.note)?;
        }
        writeln!(out, "targets:")?;
        for t in &self.targets {
            let verdict = match t.met() {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "not measured",
            };
            let margin = t.margin.map(|m| format!(" (margin x{m:.3})")).unwrap_or_default();
            writeln!(out, "  {:<48} measured {:>14}  {verdict}{margin}", t.name, format_value(t.measured))?;
        }
        Ok(())
    }

    /// The JSON document: every figure as a top-level key (null when not measured), plus
    /// `targets` and `context`.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        for f in &self.list {
            map.insert(f.key.clone(), f.value.map_or(Value::Null, |v| json!(v)));
        }
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|t| json!({"target": t.name, "measured": t.measured, "margin": t.margin, "met": t.met()}))
            .collect();
        map.insert("targets".into(), Value::Array(targets));
        map.insert("context".into(), Value::Object(self.context.clone()));
        Value::Object(map)
    }
}

/// A value with a precision that suits its size.
pub fn format_value(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(v) if v.abs() >= 1000.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.3}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_targets_and_json() {
        let mut f = Figures::default();
        f.put("e2e_deliveries_per_s", Some(2500.0), "");
        f.put("sqlite_rows_per_s_batch64", Some(50000.0), "");
        f.put("claim_ms", Some(f64::NAN), "");
        f.ratio("e2e_deliveries_per_s", "sqlite_rows_per_s_batch64");
        f.ratio("claim_ms", "sqlite_rows_per_s_batch64");
        assert_eq!(f.get("e2e_deliveries_per_s_over_sqlite_rows_per_s_batch64"), Some(0.05));
        assert_eq!(f.get("claim_ms"), None, "NaN is recorded as not measured");
        f.target("e2e >= 10000", "e2e_deliveries_per_s", 10000.0, true);
        f.target_value("p99 < 5", Some(2.0), 5.0, false);
        f.target("missing", "nothing", 1.0, true);
        let j = f.to_json();
        assert_eq!(j["e2e_deliveries_per_s"], json!(2500.0));
        assert_eq!(j["claim_ms"], Value::Null);
        assert_eq!(j["targets"][0]["met"], json!(false));
        assert_eq!(j["targets"][0]["margin"], json!(0.25));
        assert_eq!(j["targets"][1]["met"], json!(true));
        assert_eq!(j["targets"][2]["met"], Value::Null);
        let mut out = Vec::new();
        f.print_table(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("NOT met (margin x0.250)") && text.contains("not measured"), "{text}");
    }

    #[test]
    fn values_are_formatted_by_size() {
        assert_eq!(format_value(None), "-");
        assert_eq!(format_value(Some(12345.6)), "12346");
        assert_eq!(format_value(Some(12.34)), "12.3");
        assert_eq!(format_value(Some(0.1234)), "0.123");
    }
}
