//! Compose's variable interpolation (`$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
//! `${VAR:?error}`, `${VAR?error}`, `${VAR:+replacement}`, `${VAR+replacement}`, `$$`), applied
//! to a compose file's text the way `docker compose` applies it to its values.

use std::collections::BTreeMap;

/// `text` with every variable replaced from `vars`; an unset variable without a default is
/// empty, as in Compose. Fails on a `?` form whose variable is missing, or on broken syntax.
pub fn interpolate(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(after) = rest.strip_prefix('{') {
            let end = closing_brace(after).ok_or_else(|| format!("unclosed ${{ in {:?}", line_of(text, after)))?;
            out.push_str(&braced(&after[..end], vars)?);
            rest = &after[end + 1..];
        } else {
            let len = name_len(rest);
            if len == 0 {
                return Err(format!("a lone $ in {:?} (write $$ for a literal $)", line_of(text, rest)));
            }
            out.push_str(vars.get(&rest[..len]).map_or("", String::as_str));
            rest = &rest[len..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of `${expr}`.
fn braced(expr: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let len = name_len(expr);
    let (name, op) = expr.split_at(len);
    if name.is_empty() {
        return Err(format!("${{{expr}}}: not a variable name"));
    }
    let value = vars.get(name);
    let set_and_non_empty = value.is_some_and(|v| !v.is_empty());
    let (strict, op) = match op.strip_prefix(':') {
        Some(op) => (true, op),
        None => (false, op),
    };
    let present = if strict { set_and_non_empty } else { value.is_some() };
    let Some(kind) = op.chars().next() else {
        return if strict {
            Err(format!("${{{expr}}}: a `:` needs -, ?, or +"))
        } else {
            Ok(value.cloned().unwrap_or_default())
        };
    };
    let word = &op[1..];
    match kind {
        '-' if present => Ok(value.cloned().unwrap_or_default()),
        '-' => interpolate(word, vars),
        '?' if present => Ok(value.cloned().unwrap_or_default()),
        '?' => Err(format!("required variable {name} is missing: {word}")),
        '+' if present => interpolate(word, vars),
        '+' => Ok(String::new()),
        _ => Err(format!("${{{expr}}}: unsupported expansion")),
    }
}

/// The index of the `}` closing a `${` whose content starts `text` (nested `${...}` allowed).
fn closing_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'{' if i > 0 && bytes[i - 1] == b'$' => depth += 1,
            b'}' if depth == 0 => return Some(i),
            b'}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Length of the variable name `text` starts with (`[A-Za-z_][A-Za-z0-9_]*`).
fn name_len(text: &str) -> usize {
    let mut chars = text.char_indices();
    match chars.next() {
        Some((_, c)) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return 0,
    }
    chars.find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_')).map_or(text.len(), |(i, _)| i)
}

/// The line of `text` that `at` (a suffix of it) starts in, for error messages.
fn line_of<'a>(text: &'a str, at: &str) -> &'a str {
    let offset = text.len() - at.len();
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    text[start..end].trim()
}

#[test]
fn interpolation_follows_compose() {
    let vars: BTreeMap<String, String> =
        [("SET", "value"), ("EMPTY", "")].into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    let cases = [
        ("a ${SET} $SET b", "a value value b"),
        ("${UNSET}", ""),
        ("${UNSET:-x}|${EMPTY:-x}|${EMPTY-x}|${SET:-x}", "x|x||value"),
        ("${UNSET:+y}|${EMPTY:+y}|${EMPTY+y}|${SET+y}", "||y|y"),
        ("${UNSET:-${SET}}", "value"),
        ("$$SET costs $$5", "$SET costs $5"),
        ("${SET:?needed}", "value"),
    ];
    for (text, expected) in cases {
        assert_eq!(interpolate(text, &vars).as_deref(), Ok(expected), "{text}");
    }
    for broken in ["${UNSET:?needed}", "${EMPTY:?needed}", "${UNSET?needed}", "${SET", "cost: 5$", "${:-x}", "${SET:}"]
    {
        assert!(interpolate(broken, &vars).is_err(), "{broken}");
    }
}
