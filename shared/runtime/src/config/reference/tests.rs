use std::collections::BTreeMap;
use std::path::Path;

use super::*;

/// The rows of a reference, by key.
fn rows(reference: &str) -> BTreeMap<&str, &str> {
    reference.lines().filter_map(|line| Some((line.strip_prefix("| `")?.split_once('`')?.0, line))).collect()
}

#[test]
fn config_reference_is_the_committed_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(PATH);
    let generated = render();
    if std::env::var_os("IMAGEPIPE_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == generated {
        return;
    }
    let (new, old) = (rows(&generated), rows(&committed));
    let missing: Vec<_> = new.keys().filter(|key| !old.contains_key(*key)).collect();
    let changed: Vec<_> =
        new.iter().filter(|(key, row)| old.get(*key).is_some_and(|old| old != *row)).map(|(k, _)| k).collect();
    let gone: Vec<_> = old.keys().filter(|key| !new.contains_key(*key)).collect();
    panic!(
        "{PATH} is not what the code says (keys missing from it: {missing:?}; keys changed: {changed:?}; keys it has that \
         the code has not: {gone:?}; or its text around them changed); regenerate it with {REGENERATE}"
    );
}

/// Every key `imagepipe config print` prints (the defaults, with every unset key set) has its row:
/// the schema's walk reaches every key, and no value type is shown as a table of its own.
#[test]
fn config_reference_has_every_printed_key() {
    fn leaves(prefix: &str, value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::Table(table) if !prefix.ends_with("kafka.client") => {
                for (name, value) in table {
                    leaves(&format!("{prefix}{}{name}", if prefix.is_empty() { "" } else { "." }), value, out);
                }
            }
            _ => out.push(prefix.to_owned()),
        }
    }
    let reference = render();
    let documented = rows(&reference);
    let mut printed = Vec::new();
    leaves("", &toml::Value::try_from(Settings::default()).unwrap(), &mut printed);
    assert!(printed.len() > 100, "{printed:?}");
    let undocumented: Vec<_> = printed.iter().filter(|key| !documented.contains_key(key.as_str())).collect();
    assert!(undocumented.is_empty(), "keys without a row: {undocumented:?}");
    for unset in ["http.auth_token", "coordinator.search_url", "bus.nats.password", "notification.allow_cidrs"] {
        assert!(documented[unset].contains("| unset |"), "{}", documented[unset]);
    }
    assert!(documented.keys().all(|key| !key.ends_with(".secs")), "a duration without its schema");
}

#[test]
fn config_reference_says_which_lists_the_environment_sets() {
    let reference = render();
    let documented = rows(&reference);
    for key in ["net.allow_cidrs", "http.tokens", "notification.subscribers", "notification.secret"] {
        assert!(documented[key].contains("(comma-separated)"), "{}", documented[key]);
    }
    for key in ["metadata.thumbnails", "bus.kafka.retry_tiers", "bus.kafka.client"] {
        assert!(documented[key].contains("*file only*"), "{}", documented[key]);
    }
}
