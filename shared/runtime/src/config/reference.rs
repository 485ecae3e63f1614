//! The configuration reference, `docs/configuration.md`: every key of [`Settings`] with its
//! environment variable, type, default and description, rendered from the settings' JSON
//! schema (the doc comments of the `*Config` types) and from `Settings::default()`. The test
//! beside it fails when the committed file differs, so no key goes undocumented.

use serde_json::Value;

use super::Settings;
use super::load::key_to_env_name;

#[cfg(test)]
mod tests;

/// The file, from the repository's root.
const PATH: &str = "docs/configuration.md";

/// The command that rewrites the file.
const REGENERATE: &str = "IMAGEPIPE_UPDATE_DOCS=1 cargo test -p imagepipe-runtime --all-features config_reference";

/// What the file says before the keys.
const INTRO: &str = "\
# Configuration reference

<!-- Generated from the code (the doc comments of shared/runtime/src/config and of the bus and
blob crates' config types) by the `config_reference` test; do not edit by hand. Regenerate with
`IMAGEPIPE_UPDATE_DOCS=1 cargo test -p imagepipe-runtime --all-features config_reference`. -->

One schema configures every service; each reads its part, and every one checks all of it at
start (`imagepipe doctor` too), so a service never runs with a value another would refuse.

**Layers**, later ones winning: the defaults below < a TOML file (`--config imagepipe.toml`, or
the file named by `IMAGEPIPE_CONFIG`) < environment variables.

**The file** is TOML, one table per section:

```toml
[bus]
kind = \"nats\"

[bus.nats]
url = \"nats://nats:4222\"

[worker]
ack_wait = \"45s\"
```

**Environment variables** are `IMAGEPIPE_` followed by the key in capitals with `__` between
levels: `bus.nats.url` is `IMAGEPIPE_BUS__NATS__URL`, `worker.ack_wait` is
`IMAGEPIPE_WORKER__ACK_WAIT`. A list is one comma-separated string
(`IMAGEPIPE_NET__ALLOW_CIDRS=10.0.0.0/8,::1/128`); the keys marked *file only* cannot be set from
the environment. `IMAGEPIPE_*` variables without a `__` that do not start with a section name
(`IMAGEPIPE_TEST_MODEL_DIR`, `IMAGEPIPE_CACHE_DIR`) belong to tooling and are not read as
configuration; one that starts with a section name but uses `_` between levels
(`IMAGEPIPE_BUS_KIND`) is refused with a hint.

**Values**: durations are strings such as `\"500ms\"`, `\"30s\"`, `\"2m\"`, `\"1h 30m\"`, `\"7days\"`;
sizes are integers of bytes. Unknown keys are refused, and so are values no service can use;
both errors name the key. Secrets (tokens, passwords, webhook keys, credentials in URLs) are
masked whenever the configuration is printed: `imagepipe config print` prints every key with
its effective value (`--json`: as one JSON object).
";

/// The reference as Markdown: [`INTRO`], then one section per table of the settings.
fn render() -> String {
    let schema = schemars::schema_for!(Settings);
    let defaults = toml::Value::try_from(Settings::default()).expect("the default settings print as TOML");
    let renderer = Renderer { root: schema.as_value() };
    let mut out = String::from(INTRO);
    for (section, property) in properties(renderer.root) {
        let field = renderer.resolve(property);
        renderer.table(&mut out, 2, section, &field, defaults.get(section));
    }
    out
}

/// A property's schema with `$ref` and `null` (of an `Option`) taken away, and the two
/// descriptions: the field's and its type's.
struct Field {
    schema: Value,
    /// Whether the schema allows `null` (an `Option`, unset by default unless it says).
    optional: bool,
    field_doc: Option<String>,
    type_doc: Option<String>,
}

struct Renderer<'a> {
    root: &'a Value,
}

impl Renderer<'_> {
    /// The definition `schema` refers to (through `$ref`, or the one non-null alternative of an
    /// `Option`), with its descriptions.
    fn resolve(&self, schema: &Value) -> Field {
        let field_doc = description(schema);
        let mut current = schema.clone();
        let mut type_doc = None;
        let mut optional = false;
        loop {
            if let Some(reference) = current.get("$ref").and_then(Value::as_str) {
                let name = reference.trim_start_matches("#/$defs/");
                let mut target = self.root["$defs"][name].clone();
                type_doc = description(&target).or(type_doc);
                for (key, value) in current.as_object().into_iter().flatten() {
                    if key != "$ref" && key != "description" {
                        target[key] = value.clone();
                    }
                }
                current = target;
                continue;
            }
            let alternatives = current.get("anyOf").and_then(Value::as_array).map(|alternatives| {
                alternatives
                    .iter()
                    .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                    .collect::<Vec<_>>()
            });
            if let Some([single]) = alternatives.as_deref() {
                optional = true;
                current = (*single).clone();
                continue;
            }
            break;
        }
        if let Some(types) = current.get("type").and_then(Value::as_array) {
            let types: Vec<_> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
            optional |= types.len() < current["type"].as_array().map_or(0, Vec::len);
            if let [single] = types.as_slice() {
                current["type"] = single.clone();
            }
        }
        if let Some(object) = current.as_object_mut() {
            object.remove("description");
        }
        Field { schema: current, optional, field_doc, type_doc }
    }

    /// The table at `key` (a heading, its description and one row per key), then its tables.
    fn table(&self, out: &mut String, depth: usize, key: &str, field: &Field, defaults: Option<&toml::Value>) {
        out.push_str(&format!("\n{} `{key}`\n\n", "#".repeat(depth)));
        // A type's doc that only names its section ("The `ai` section.") says less than the field's.
        let only_names_it =
            |doc: &String| doc.starts_with("The `") && !doc.contains(':') && doc.matches(". ").count() == 0;
        let doc = field.type_doc.clone().filter(|doc| !only_names_it(doc)).or_else(|| field.field_doc.clone());
        if let Some(doc) = doc {
            out.push_str(&format!("{}\n\n", clean(&doc)));
        }
        let mut rows = Vec::new();
        let mut tables = Vec::new();
        for (name, property) in properties(&field.schema) {
            let child = self.resolve(property);
            let child_key = format!("{key}.{name}");
            let default = defaults.and_then(|d| d.get(name));
            if is_table(&child.schema) {
                tables.push((child_key, child, default));
            } else {
                self.rows(&mut rows, &child_key, &child, default);
            }
        }
        if !rows.is_empty() {
            out.push_str("| key | type | default | environment variable | description |\n|---|---|---|---|---|\n");
            for row in rows {
                out.push_str(&row);
            }
        }
        for (child_key, child, default) in tables {
            self.table(out, depth + 1, &child_key, &child, default);
        }
    }

    /// The row of the key `key`, and for a list of tables one row per key of its tables.
    fn rows(&self, rows: &mut Vec<String>, key: &str, field: &Field, default: Option<&toml::Value>) {
        let schema = &field.schema;
        let default = match (schema.get("x-default").and_then(Value::as_str), default) {
            (Some(text), _) => text.to_owned(),
            (None, Some(value)) => code(&value.to_string()) + &byte_size(key, value.as_integer()),
            // A list left out of the printed settings when it is empty.
            (None, None) if !field.optional && schema["type"] == "array" => code("[]"),
            (None, None) => "unset".to_owned(),
        };
        let description = field.field_doc.as_deref().map(clean).unwrap_or_default() + &variants(schema);
        rows.push(row(key, &self.type_name(schema), &default, &env_cell(key, schema), &description));

        let item = schema.get("items").map(|items| self.resolve(items));
        if let Some(item) = item.filter(|item| is_table(&item.schema)) {
            let required: Vec<&str> = item.schema["required"]
                .as_array()
                .map(|names| names.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (name, property) in properties(&item.schema) {
                let child = self.resolve(property);
                let default = match property.get("default") {
                    Some(value) => code(&value.to_string()),
                    None if required.contains(&name.as_str()) => "required".to_owned(),
                    None => "unset".to_owned(),
                };
                let description = child.field_doc.as_deref().map(clean).unwrap_or_default() + &variants(&child.schema);
                let child_key = format!("{key}[].{name}");
                rows.push(row(&child_key, &self.type_name(&child.schema), &default, "—", &description));
            }
        }
    }

    /// How a user writes a value of `schema`: `duration`, `integer`, `"a"` \| `"b"`, ...
    fn type_name(&self, schema: &Value) -> String {
        if let Some(name) = schema.get("x-type").and_then(Value::as_str) {
            return name.to_owned();
        }
        let values = enum_values(schema);
        if !values.is_empty() {
            return values.iter().map(|(value, _)| code(&format!("{value:?}"))).collect::<Vec<_>>().join(" \\| ");
        }
        let format = schema.get("format").and_then(Value::as_str);
        match (schema.get("type").and_then(Value::as_str), format) {
            (Some("string"), Some("duration")) => "duration".into(),
            (Some("string"), Some("ip")) => "IP address".into(),
            (Some("string"), _) => "string".into(),
            (Some("integer"), _) => "integer".into(),
            (Some("number"), _) => "number".into(),
            (Some("boolean"), _) => "boolean".into(),
            (Some("array"), _) => {
                let item = schema.get("items").map(|items| self.resolve(items).schema).unwrap_or(Value::Null);
                let item = if is_table(&item) { "table".to_owned() } else { self.type_name(&item) };
                format!("list of {item}s")
            }
            (Some("object"), _) => "table of strings".into(),
            _ => panic!("no type name for the schema {schema}"),
        }
    }
}

/// `key`'s environment variable; for a list or table, whether the environment can set it at
/// all (tried: a string there is refused as the wrong type when it cannot).
fn env_cell(key: &str, schema: &Value) -> String {
    let name = key_to_env_name(key);
    if !matches!(schema.get("type").and_then(Value::as_str), Some("array" | "object")) {
        return code(&name);
    }
    match Settings::read(None, [(name.as_str(), "")]) {
        Err(e) if e.to_string().contains("invalid type: string") => "*file only*".to_owned(),
        _ => format!("{} (comma-separated)", code(&name)),
    }
}

/// The properties of an object schema, in order.
fn properties(schema: &Value) -> impl Iterator<Item = (&String, &Value)> {
    schema.get("properties").and_then(Value::as_object).into_iter().flatten()
}

/// Whether `schema` is a table of named keys (a section), not a value.
fn is_table(schema: &Value) -> bool {
    schema.get("properties").is_some()
}

/// The values of an enumeration with their descriptions (`oneOf` of `const`s, or `enum`).
fn enum_values(schema: &Value) -> Vec<(String, Option<String>)> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().filter_map(Value::as_str).map(|v| (v.to_owned(), None)).collect();
    }
    let alternatives = schema.get("oneOf").and_then(Value::as_array).into_iter().flatten();
    alternatives
        .filter_map(|alternative| {
            let value = alternative.get("const").or_else(|| alternative.get("enum")?.get(0))?.as_str()?;
            Some((value.to_owned(), description(alternative)))
        })
        .collect()
}

/// What each value of an enumeration means, when its variants say.
fn variants(schema: &Value) -> String {
    let values = enum_values(schema);
    if values.iter().all(|(_, doc)| doc.is_none()) {
        return String::new();
    }
    let described = values
        .iter()
        .map(|(value, doc)| format!("{}: {}", code(value), doc.as_deref().map(clean).unwrap_or_default()))
        .collect::<Vec<_>>();
    format!(" {}", described.join(" "))
}

fn description(schema: &Value) -> Option<String> {
    schema.get("description").and_then(Value::as_str).map(str::to_owned)
}

/// A doc comment as one line of a table cell: lines joined, rustdoc links as their text, `|`
/// escaped.
fn clean(doc: &str) -> String {
    let joined = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    let mut rest = joined.as_str();
    while let Some(start) = rest.find('[') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find(']') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let (text, tail) = (&after[..end], &after[end + 1..]);
        if let Some(link) = tail.strip_prefix('(').and_then(|t| t.split_once(')')) {
            out.push_str(text);
            rest = link.1;
        } else if text.starts_with('`') && text.ends_with('`') {
            out.push_str(text);
            rest = tail;
        } else {
            out.push('[');
            rest = after;
        }
    }
    out.push_str(rest);
    out.replace('|', "\\|")
}

/// `text` as inline code.
fn code(text: &str) -> String {
    format!("`{}`", text.replace('|', "\\|"))
}

/// ` (25 MiB)` after a whole number of KiB, MiB or GiB of a key counting bytes.
fn byte_size(key: &str, value: Option<i64>) -> String {
    let Some(bytes) = value.filter(|_| key.ends_with("bytes")) else { return String::new() };
    let unit = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
        .into_iter()
        .find(|(size, _)| bytes >= *size && bytes % size == 0);
    unit.map(|(size, name)| format!(" ({} {name})", bytes / size)).unwrap_or_default()
}

fn row(key: &str, type_name: &str, default: &str, env: &str, description: &str) -> String {
    format!("| {} | {type_name} | {default} | {env} | {description} |\n", code(key))
}
